//! The window ladder: the fixed context sizes a session's cache can be compiled for.

use crate::{Result, RuntimeError};

/// The smallest rung of the default ladder.
pub const DEFAULT_FIRST_WINDOW: usize = 1024;

/// The largest rung of the default ladder, whatever context a model file claims: a
/// file's `context_length` is a claim, not a size to allocate (one claiming 2³²−1
/// positions asked a pass's scratch for 2 TiB). Longer windows are there for the asking
/// (`--windows`), within the model's context.
pub const MAX_DEFAULT_WINDOW: usize = 1 << 17;

/// Strictly increasing windows, the last no larger than the model's context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowLadder {
    windows: Vec<usize>,
}

impl WindowLadder {
    /// 1K, 2K, 4K, … doubling up to `n_ctx`, the top rung, or [`MAX_DEFAULT_WINDOW`]
    /// if that is smaller.
    pub fn default_for(n_ctx: usize) -> Self {
        Self::doubling(DEFAULT_FIRST_WINDOW, n_ctx.min(MAX_DEFAULT_WINDOW))
    }

    /// `first`, `2·first`, … below `n_ctx`, then `n_ctx`.
    pub fn doubling(first: usize, n_ctx: usize) -> Self {
        let mut windows = Vec::new();
        let mut w = first.max(1);
        while w < n_ctx {
            windows.push(w);
            w = w.saturating_mul(2);
        }
        windows.push(n_ctx);
        Self { windows }
    }

    /// Validates an explicit ladder against the model's context.
    pub fn new(windows: Vec<usize>, n_ctx: usize) -> Result<Self> {
        let bad = |msg: String| Err(RuntimeError::BadLadder(msg));
        if windows.is_empty() {
            return bad("no windows given".to_string());
        }
        if windows.contains(&0) {
            return bad("a window of 0 tokens".to_string());
        }
        if let Some(pair) = windows.windows(2).find(|p| p[1] <= p[0]) {
            return bad(format!(
                "windows must increase, but {} follows {}",
                pair[1], pair[0]
            ));
        }
        let largest = windows[windows.len() - 1];
        if largest > n_ctx {
            return bad(format!(
                "window {largest} exceeds the model's context of {n_ctx}"
            ));
        }
        Ok(Self { windows })
    }

    /// Parses `1024,2048,4096` (a `k` suffix multiplies by 1024).
    pub fn parse(text: &str, n_ctx: usize) -> Result<Self> {
        let windows = text
            .split(',')
            .map(|w| {
                let w = w.trim();
                let (digits, unit) = match w.strip_suffix(['k', 'K']) {
                    Some(d) => (d, 1024),
                    None => (w, 1),
                };
                digits
                    .parse::<usize>()
                    .ok()
                    .and_then(|n| n.checked_mul(unit))
                    .ok_or_else(|| RuntimeError::BadLadder(format!("'{w}' is not a window size")))
            })
            .collect::<Result<Vec<_>>>()?;
        Self::new(windows, n_ctx)
    }

    pub fn windows(&self) -> &[usize] {
        &self.windows
    }

    pub fn largest(&self) -> usize {
        self.windows[self.windows.len() - 1]
    }

    /// The rung index of the smallest window holding `len` positions.
    pub fn rung_for(&self, len: usize) -> Result<usize> {
        self.windows
            .iter()
            .position(|&w| w >= len)
            .ok_or(RuntimeError::BeyondLargestWindow {
                needed: len,
                largest: self.largest(),
            })
    }
}

impl std::fmt::Display for WindowLadder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<String> = self.windows.iter().map(|w| w.to_string()).collect();
        f.write_str(&names.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_ladder_doubles_up_to_the_context() {
        assert_eq!(
            WindowLadder::default_for(8192).windows(),
            [1024, 2048, 4096, 8192]
        );
        assert_eq!(
            WindowLadder::default_for(32768 + 5).windows().last(),
            Some(&32773)
        );
        assert_eq!(WindowLadder::default_for(512).windows(), [512]);
        // A file's claim of 2^32 - 1 positions is not a size.
        let huge = WindowLadder::default_for(u32::MAX as usize);
        assert_eq!(huge.largest(), MAX_DEFAULT_WINDOW);
        assert_eq!(huge.windows().len(), 8);
    }

    #[test]
    fn parse_and_reject() {
        let l = WindowLadder::parse("1k, 2048,4K", 8192).unwrap();
        assert_eq!(l.windows(), [1024, 2048, 4096]);
        assert_eq!(l.rung_for(1024).unwrap(), 0);
        assert_eq!(l.rung_for(1025).unwrap(), 1);
        assert!(matches!(
            l.rung_for(5000),
            Err(RuntimeError::BeyondLargestWindow { needed: 5000, .. })
        ));
        for (text, msg) in [
            ("2048,1024", "must increase"),
            ("1024,1024", "must increase"),
            ("1024,16384", "exceeds the model's context of 8192"),
            ("0,1024", "window of 0"),
            ("1024,abc", "'abc' is not a window size"),
            ("-5", "'-5' is not"),
        ] {
            let err = WindowLadder::parse(text, 8192).unwrap_err().to_string();
            assert!(err.contains(msg), "{text}: {err}");
        }
    }
}
