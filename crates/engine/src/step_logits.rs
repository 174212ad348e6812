//! A step's logits where its passes left them: each pass's buffer as the executable
//! returned it, and which rows of which buffer belong to which sequence.
//!
//! A decoding sequence's row is a whole vocabulary (192 KiB for SmolLM2), so copying each
//! sequence's rows out of its pass cost a memory copy of every logit every step, and
//! buffers allocated fresh every step came from the kernel zeroed page by page (7 % of a
//! 32-sequence decode). Here nothing is copied, and [`LogitBuffers`] keeps the buffers
//! from step to step.

use std::ops::Range;

use crate::request::RequestId;

/// Every pass's logits of a step and each sequence's rows among them.
#[derive(Debug, Default)]
pub struct StepLogits {
    /// Each pass's logits, `[rows, n_vocab]`, in the order the passes ran.
    passes: Vec<Vec<f32>>,
    /// Each sequence's rows: its pass and where they are in that pass's buffer. Within a
    /// pass, in the order they sit in the buffer, apart.
    rows: Vec<(RequestId, usize, Range<usize>)>,
}

impl StepLogits {
    /// Adds a pass's buffer; returns the pass's index for [`Self::push_rows`].
    pub(crate) fn push_pass(&mut self, logits: Vec<f32>) -> usize {
        self.passes.push(logits);
        self.passes.len() - 1
    }

    /// Records that `range` of pass `pass`'s buffer are `id`'s rows.
    ///
    /// # Panics
    /// If `range` is outside the pass's buffer or starts before the pass's last rows end:
    /// both would be a bug in the executor.
    pub(crate) fn push_rows(&mut self, id: RequestId, pass: usize, range: Range<usize>) {
        assert!(
            range.end <= self.passes[pass].len(),
            "rows outside the pass"
        );
        let last_end = self
            .rows
            .iter()
            .rev()
            .find(|(_, p, _)| *p == pass)
            .map_or(0, |(_, _, r)| r.end);
        assert!(
            range.start >= last_end,
            "a pass's rows are recorded in order"
        );
        self.rows.push((id, pass, range));
    }

    /// Sequences with logits.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Each sequence's rows, in the order they were recorded.
    pub fn iter(&self) -> impl Iterator<Item = (RequestId, &[f32])> {
        self.rows
            .iter()
            .map(|(id, pass, range)| (*id, &self.passes[*pass][range.clone()]))
    }

    /// Each sequence's rows to change in place (a grammar's mask, a sampler's penalties),
    /// in the order they were recorded.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (RequestId, &mut [f32])> {
        // What is left of each pass's buffer after the rows handed out so far, and where
        // that rest starts.
        let mut rest: Vec<(usize, &mut [f32])> = self
            .passes
            .iter_mut()
            .map(|buffer| (0, buffer.as_mut_slice()))
            .collect();
        self.rows.iter().map(move |(id, pass, range)| {
            let (start, buffer) = std::mem::take(&mut rest[*pass]);
            let (_, from_range) = buffer.split_at_mut(range.start - start);
            let (rows, after) = from_range.split_at_mut(range.len());
            rest[*pass] = (range.end, after);
            (*id, rows)
        })
    }

    /// The buffers, for [`LogitBuffers::give_back`].
    pub(crate) fn into_buffers(self) -> Vec<Vec<f32>> {
        self.passes
    }
}

/// Pass buffers kept from step to step.
#[derive(Default)]
pub(crate) struct LogitBuffers {
    spare: Vec<Vec<f32>>,
}

impl LogitBuffers {
    /// A buffer for a pass to write (an executable replaces its contents).
    pub(crate) fn take(&mut self) -> Vec<f32> {
        self.spare.pop().unwrap_or_default()
    }

    /// Buffers a step is done with.
    pub(crate) fn give_back(&mut self, buffers: impl IntoIterator<Item = Vec<f32>>) {
        self.spare.extend(buffers);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step() -> StepLogits {
        let mut step = StepLogits::default();
        let first = step.push_pass((0..10).map(|i| i as f32).collect());
        let second = step.push_pass(vec![100.0, 101.0]);
        step.push_rows(1, first, 0..4);
        step.push_rows(2, second, 0..2);
        // A failed sequence's rows in between are skipped.
        step.push_rows(3, first, 6..10);
        step
    }

    #[test]
    fn each_sequence_gets_its_own_rows() {
        let mut step = step();
        let expected: Vec<(RequestId, Vec<f32>)> = vec![
            (1, vec![0.0, 1.0, 2.0, 3.0]),
            (2, vec![100.0, 101.0]),
            (3, vec![6.0, 7.0, 8.0, 9.0]),
        ];
        let read: Vec<_> = step.iter().map(|(id, r)| (id, r.to_vec())).collect();
        assert_eq!(read, expected);
        for (_, rows) in step.iter_mut() {
            rows.iter_mut().for_each(|x| *x = -*x);
        }
        let negated: Vec<_> = step.iter().map(|(id, r)| (id, r.to_vec())).collect();
        let expected_negated: Vec<_> = expected
            .into_iter()
            .map(|(id, r)| (id, r.into_iter().map(|x| -x).collect::<Vec<_>>()))
            .collect();
        assert_eq!(negated, expected_negated);
        assert_eq!(step.len(), 3);
        assert_eq!(step.into_buffers()[0][4..6], [4.0, 5.0]);
    }

    #[test]
    #[should_panic(expected = "in order")]
    fn rows_out_of_order_are_refused() {
        let mut step = step();
        step.push_rows(4, 0, 2..3);
    }

    #[test]
    fn buffers_given_back_are_handed_out_again() {
        let mut buffers = LogitBuffers::default();
        let mut first = buffers.take();
        first.extend([1.0; 9]);
        let capacity = first.capacity();
        buffers.give_back([first]);
        let again = buffers.take();
        assert_eq!(again.capacity(), capacity);
        assert!(buffers.take().is_empty());
    }
}
