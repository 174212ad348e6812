//! One request as the scheduler keeps it, from the queue to its end: its tokens, its
//! session (once admitted), its sampler and drafter, its timings, and its status.

use std::time::{Duration, Instant};

use pyramid_runtime::Sampler;

use crate::observe::{SessionKey, SessionState, SessionView};
use crate::request::{Request, RequestId, Timings, Usage};
use crate::session::Session;
use crate::speculate::Drafter;

/// Where a sequence is in its life. Every transition goes through a `Sequence` method,
/// so the status always agrees with the fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SequenceStatus {
    /// Waiting in the queue; no session yet.
    Queued,
    /// Waiting (queued, or swapped out) for the conversation it resumes to be read
    /// from disk; the others keep stepping.
    Loading,
    /// In the batch, its prompt (or what it held before a swap) still going in.
    Prefilling,
    /// In the batch, sampling a token per step.
    Decoding,
    /// Out of the batch for a more urgent one, keeping its session and KV.
    Paused,
    /// Out of the batch with its KV given up for memory; it will prefill what it held
    /// again unless its session is still cached when it resumes.
    Swapped,
    /// Ended: it is being retired and reported.
    Finished,
}

/// A request's level after waiting `waited`: lower runs first.
pub(crate) fn level(priority: i32, waited: Duration, aging: Duration) -> i64 {
    let aged = if aging.is_zero() {
        0
    } else {
        i64::try_from(waited.as_nanos() / aging.as_nanos()).unwrap_or(i64::MAX)
    };
    i64::from(priority).saturating_sub(aged)
}

pub(crate) struct Sequence {
    /// Its prompt moved to `input`.
    pub request: Request,
    status: SequenceStatus,
    pub prompt_len: usize,
    /// Tokens to have in the cache before the next sample: the prompt, or (swapped out
    /// and resumed) everything the session held and the token after it.
    pub input: Vec<u32>,
    pub session: Session,
    /// Tokens of `input` in the cache so far (the first `cached_tokens` of the prompt
    /// came with it).
    pub fed: usize,
    pub cached_tokens: usize,
    /// Of `cached_tokens`, those from a conversation the session store read back.
    pub restored_tokens: usize,
    /// The sampled token to feed next, once the prompt is in.
    pub next_input: Option<u32>,
    /// An embedding's pooled hidden states so far (`[n_embd]`; empty otherwise).
    pub pooled: Vec<f32>,
    pub sampler: Sampler,
    pub generated: usize,
    pub submitted: Instant,
    /// Its place in line among requests of one level.
    pub arrival: u64,
    pub admitted: Option<Instant>,
    /// Since it last entered the batch, and at which level.
    pub running_since: Instant,
    pub entry_level: i64,
    /// Since when it is paused (or swapped out), if it is.
    pub paused_since: Option<Instant>,
    /// Time spent paused before the current run.
    pub paused_for: Duration,
    /// Tokens its session held when it was swapped out (0 unless it was).
    pub swapped_len: usize,
    pub first_token: Option<Instant>,
    pub last_token: Option<Instant>,
    /// Since when it waits for an artifact or memory to move to a larger window.
    pub stalled_since: Option<Instant>,
    /// Time spent on the constraint's masks.
    pub mask_time: Duration,
    pub drafter: Drafter,
    /// A stored conversation read back for it, taken in when it is admitted.
    pub restored: Option<Session>,
    /// What it was before it started waiting for a file (queued or swapped).
    before_loading: Option<SequenceStatus>,
    /// Whether it has asked for a file since it last gave its KV up: a read that
    /// failed is not asked for again (it prefills).
    pub asked_store: bool,
}

impl Sequence {
    /// A request entering the queue at `now`, `arrival`-th in line.
    pub fn queued(mut request: Request, sampler: Sampler, arrival: u64, now: Instant) -> Self {
        let input = std::mem::take(&mut request.prompt);
        let entry_level = i64::from(request.priority);
        Sequence {
            prompt_len: input.len(),
            input,
            request,
            status: SequenceStatus::Queued,
            session: Session::default(),
            fed: 0,
            cached_tokens: 0,
            restored_tokens: 0,
            next_input: None,
            pooled: Vec::new(),
            sampler,
            generated: 0,
            submitted: now,
            arrival,
            admitted: None,
            running_since: now,
            entry_level,
            paused_since: None,
            paused_for: Duration::ZERO,
            swapped_len: 0,
            first_token: None,
            last_token: None,
            stalled_since: None,
            mask_time: Duration::ZERO,
            drafter: Drafter::default(),
            restored: None,
            before_loading: None,
            asked_store: false,
        }
    }

    pub fn id(&self) -> RequestId {
        self.request.id
    }

    /// How a watcher sees it (`None` once finished).
    pub fn view(&self) -> Option<SessionView> {
        let state = match self.status {
            SequenceStatus::Queued => SessionState::Queued,
            SequenceStatus::Prefilling | SequenceStatus::Decoding => SessionState::Running,
            SequenceStatus::Paused => SessionState::Paused,
            SequenceStatus::Swapped => SessionState::Swapped,
            SequenceStatus::Loading => match self.before_loading {
                Some(SequenceStatus::Swapped) => SessionState::Swapped,
                _ => SessionState::Queued,
            },
            SequenceStatus::Finished => return None,
        };
        Some(SessionView {
            key: SessionKey::Request(self.request.id),
            state,
            priority: self.request.priority,
            prompt_len: self.prompt_len,
            n_generated: self.generated,
            context_len: self.session.len(),
            window: self.session.window(),
            since: self.submitted,
        })
    }

    pub fn status(&self) -> SequenceStatus {
        self.status
    }

    /// Whether it waits outside the batch holding an admitted session (paused or swapped).
    pub fn is_paused(&self) -> bool {
        matches!(
            self.status,
            SequenceStatus::Paused | SequenceStatus::Swapped
        )
    }

    pub fn prefilling(&self) -> bool {
        self.fed < self.input.len()
    }

    /// Whether it is an embedding: prefilled alone, from no cached prefix.
    pub fn embeds(&self) -> bool {
        self.request.is_embedding()
    }

    /// The rows of its next prompt chunk of `n` tokens an embedding pools.
    pub fn pooled_rows(&self, n: usize) -> Option<std::ops::Range<usize>> {
        let pooling = self.request.pooling?;
        Some(pooling.rows(self.fed, n, self.input.len()))
    }

    /// Admitted from the queue at `now`, its first `reused` prompt tokens already cached.
    pub fn admit(&mut self, session: Session, reused: usize, now: Instant) {
        debug_assert_eq!(self.status, SequenceStatus::Queued);
        self.session = session;
        self.fed = reused;
        self.cached_tokens = reused;
        self.admitted = Some(now);
    }

    /// Back in the queue, its session given back (admission could not place it).
    pub fn requeue(&mut self) -> Session {
        self.fed = 0;
        self.cached_tokens = 0;
        self.restored_tokens = 0;
        self.admitted = None;
        self.status = SequenceStatus::Queued;
        std::mem::take(&mut self.session)
    }

    /// Enters the batch at `level`, now.
    pub fn start_running(&mut self, level: i64, now: Instant) {
        self.running_since = now;
        self.entry_level = level;
        if let Some(since) = self.paused_since.take() {
            self.paused_for += now.saturating_duration_since(since);
        }
        self.refresh_running();
    }

    /// Its tokens went into the cache: `n` prompt tokens, or the next input (and a draft).
    pub fn fed_tokens(&mut self, n: usize, prefill: bool) {
        if prefill {
            self.fed += n;
        } else {
            self.next_input = None;
        }
        self.refresh_running();
    }

    fn refresh_running(&mut self) {
        self.status = if self.prefilling() {
            SequenceStatus::Prefilling
        } else {
            SequenceStatus::Decoding
        };
    }

    /// Waits for the conversation it resumes to be read from disk.
    pub fn start_loading(&mut self) {
        debug_assert!(matches!(
            self.status,
            SequenceStatus::Queued | SequenceStatus::Paused | SequenceStatus::Swapped
        ));
        self.before_loading = Some(self.status);
        self.status = SequenceStatus::Loading;
        self.asked_store = true;
    }

    /// The read is over: `restored` is what it brought (`None`: it failed, prefill).
    pub fn loaded(&mut self, restored: Option<Session>) {
        if let Some(before) = self.before_loading.take() {
            self.status = before;
        }
        self.restored = restored;
    }

    /// Leaves the batch keeping its KV.
    pub fn pause(&mut self, now: Instant) {
        self.paused_since = Some(now);
        self.status = SequenceStatus::Paused;
    }

    /// Gives its KV up: returns its session (for the prefix cache), and will prefill
    /// what it held again unless it finds it cached when it resumes.
    pub fn swap_out(&mut self) -> Session {
        debug_assert_eq!(self.status, SequenceStatus::Paused);
        let session = std::mem::take(&mut self.session);
        let mut input = session.tokens().to_vec();
        match self.next_input.take() {
            Some(t) => input.push(t),
            None => input.extend_from_slice(&self.input[self.fed..]),
        }
        self.input = input;
        self.fed = 0;
        // An embedding pools every row again.
        self.pooled.iter_mut().for_each(|x| *x = 0.0);
        self.swapped_len = session.len();
        self.status = SequenceStatus::Swapped;
        self.asked_store = false;
        session
    }

    /// A swapped-out sequence takes back a session holding the first `reused` tokens of
    /// what it held (possibly none).
    pub fn reattach(&mut self, session: Session, reused: usize) {
        debug_assert_eq!(self.status, SequenceStatus::Swapped);
        self.session = session;
        self.session.truncate(reused);
        self.fed = reused;
    }

    /// A swapped-out sequence that could not resume gives its reattached session back.
    pub fn detach(&mut self) -> Session {
        self.fed = 0;
        std::mem::take(&mut self.session)
    }

    /// Ends: what it did, for the final event.
    pub fn finish(&mut self) {
        self.status = SequenceStatus::Finished;
    }

    /// Its priority level now: paused, its priority lowered by its wait; running, its
    /// priority, or for one aging interval after it entered the batch the level it
    /// entered at, if lower (so an aged request runs a quantum before it can be paused
    /// again); queued, its priority lowered by its wait in the queue.
    pub fn level(&self, now: Instant, aging: Duration) -> i64 {
        let own = i64::from(self.request.priority);
        match self.status {
            SequenceStatus::Queued => level(
                self.request.priority,
                now.saturating_duration_since(self.submitted),
                aging,
            ),
            SequenceStatus::Paused | SequenceStatus::Swapped | SequenceStatus::Loading
                if self.paused_since.is_some() =>
            {
                level(
                    self.request.priority,
                    self.paused_since
                        .map_or(Duration::ZERO, |t| now.saturating_duration_since(t)),
                    aging,
                )
            }
            SequenceStatus::Loading => level(
                self.request.priority,
                now.saturating_duration_since(self.submitted),
                aging,
            ),
            _ if now.saturating_duration_since(self.running_since) < aging => {
                own.min(self.entry_level)
            }
            _ => own,
        }
    }

    pub fn usage(&self) -> Usage {
        Usage {
            prompt_tokens: self.prompt_len,
            completion_tokens: self.generated,
            cached_tokens: self.cached_tokens,
            restored_tokens: self.restored_tokens,
            speculative: self.drafter.stats,
        }
    }

    pub fn timings(&self) -> Timings {
        let ms = |a: Instant, b: Instant| b.saturating_duration_since(a).as_secs_f64() * 1e3;
        let admitted = self.admitted.unwrap_or(self.submitted);
        let first = self.first_token.unwrap_or(admitted);
        Timings {
            prefill_ms: ms(admitted, first),
            n_prefill: self.prompt_len - self.cached_tokens,
            decode_ms: ms(first, self.last_token.unwrap_or(first)),
            n_decode: self.generated.saturating_sub(1),
            queue_ms: ms(self.submitted, admitted),
            paused_ms: (self.paused_for
                + self.paused_since.map_or(Duration::ZERO, |t| t.elapsed()))
            .as_secs_f64()
                * 1e3,
            mask_ms: self.mask_time.as_secs_f64() * 1e3,
        }
    }
}
