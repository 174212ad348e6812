//! How a fetch reports what it is doing. The library only calls the trait; the CLI picks the
//! implementation (a progress bar on a terminal, nothing in tests or scripts).

use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Receives progress from [`ModelCache::fetch`](crate::ModelCache::fetch).
///
/// Bytes count the model file as it is written, so `advance` sums to `total_bytes` on success.
/// `finish` is called once after `start`, whether the fetch succeeded or failed. `message`
/// may also come before `start` (e.g. while waiting for another process's fetch).
pub trait FetchProgress {
    /// A fetch of `model` begins; the finished file will have `total_bytes`.
    fn start(&self, model: &str, total_bytes: u64);
    /// `bytes` more of the model file were written.
    fn advance(&self, bytes: u64);
    /// What is happening now, e.g. which wheel pip is downloading.
    fn message(&self, msg: &str);
    /// Something the user must see and keep, such as a licence notice: not replaced by
    /// the next step's message.
    fn notice(&self, text: &str);
    /// The fetch ended.
    fn finish(&self);
}

/// Reports nothing; for tests, scripts and callers that print their own status.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoProgress;

impl FetchProgress for NoProgress {
    fn start(&self, _model: &str, _total_bytes: u64) {}
    fn advance(&self, _bytes: u64) {}
    fn message(&self, _msg: &str) {}
    fn notice(&self, _text: &str) {}
    fn finish(&self) {}
}

/// A progress bar on stderr: the current step on one line, bytes, rate and ETA on the next.
/// It ticks on its own so it stays alive while pip downloads a wheel (which reports no bytes
/// until the wheel is complete). Nothing is drawn when stderr is not a terminal.
#[derive(Debug)]
pub struct IndicatifProgress {
    bar: ProgressBar,
}

const TICK: Duration = Duration::from_millis(120);

impl IndicatifProgress {
    pub fn new() -> Self {
        // Hidden until there is something to say, so no empty bar flashes up.
        let bar = ProgressBar::hidden();
        bar.set_style(
            ProgressStyle::with_template("{spinner} {prefix}{wide_msg}")
                .expect("the template above is valid"),
        );
        Self { bar }
    }

    fn show(&self) {
        if self.bar.is_hidden() {
            self.bar.set_draw_target(ProgressDrawTarget::stderr());
            self.bar.enable_steady_tick(TICK);
        }
    }
}

impl Default for IndicatifProgress {
    fn default() -> Self {
        Self::new()
    }
}

impl FetchProgress for IndicatifProgress {
    fn start(&self, model: &str, total_bytes: u64) {
        self.bar.set_style(
            ProgressStyle::with_template(
                "{spinner} {prefix}{wide_msg}\n  [{wide_bar}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
            )
            .expect("the template above is valid")
            .progress_chars("=> "),
        );
        self.bar.set_prefix(format!("{model}: "));
        self.bar.set_length(total_bytes);
        self.bar.set_position(0);
        self.bar.reset_eta();
        self.show();
    }

    fn advance(&self, bytes: u64) {
        self.bar.inc(bytes);
    }

    fn message(&self, msg: &str) {
        self.bar.set_message(msg.to_string());
        self.show();
    }

    fn notice(&self, text: &str) {
        // Printed whether or not stderr is a terminal: a notice is not decoration.
        self.bar.suspend(|| eprintln!("{text}"));
    }

    fn finish(&self) {
        // A fetch that stopped short leaves the bar where it stopped, so the error that
        // follows has context; a complete one replaces the step message with "done".
        if Some(self.bar.position()) == self.bar.length() {
            self.bar.finish_with_message("done");
        } else {
            self.bar.abandon();
        }
    }
}
