//! The engine loop: one thread owns the model and, every step, advances every running
//! sequence in one batched forward pass.
//!
//! - **Continuous batching.** Requests join between steps. A step carries one token for
//!   each decoding sequence plus at most one prefill chunk's worth of prompt tokens, so a
//!   long prompt is prefilled over several steps while everyone else's stream keeps moving.
//! - **Session reuse.** A finished conversation keeps its tokens and KV cache. A request
//!   whose prompt extends one of them (the longest shared token prefix wins) takes it over
//!   and prefills only the new tokens; the cached conversations are evicted least recently
//!   used first when the KV budget or the session limit would be exceeded.
//! - **The window pyramid.** A sequence's cache is sized to a rung of the window ladder and
//!   migrates into the next rung when it outgrows it: a copy of the live positions, never a
//!   re-prefill. On the native CPU backend a window needs no compiled artifact, so a
//!   migration never waits for one.
//!
//! Results do not depend on what else is in a batch: every row of a forward pass is
//! computed independently (see the model's forward pass), so a greedy request gives the
//! same tokens alone or beside thirty others.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use pyramid_kernels::ThreadPool;
use pyramid_model::{KvType, Model};
use pyramid_runtime::{step_batch, Sampler, SamplerConfig, Scratch, Session, WindowLadder};
use pyramid_tokenizer::{StreamDecoder, Tokenizer};
use serde::Serialize;
use tokio::sync::mpsc::UnboundedSender;

use crate::error::ApiError;
use crate::metrics::Metrics;

/// Limits of the engine loop.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Sequences advanced together in one step.
    pub max_batch: usize,
    /// Requests waiting for a place in the batch; beyond it, 429.
    pub max_queue: usize,
    /// Conversations held (running and cached).
    pub max_sessions: usize,
    /// Bytes of KV cache held by running and cached conversations together; cached ones
    /// are evicted to stay within it.
    pub kv_budget: usize,
    /// Prompt tokens prefilled per step, across all sequences.
    pub prefill_chunk: usize,
    pub ladder: WindowLadder,
    pub kv_type: KvType,
}

/// A tokenised request, ready for the engine.
pub struct Job {
    pub prompt: Vec<u32>,
    pub max_tokens: Option<usize>,
    pub sampler: SamplerConfig,
    pub stop: Vec<String>,
    pub logprobs: Option<usize>,
    pub events: UnboundedSender<Event>,
    pub submitted: Instant,
}

/// What the engine tells a request's handler.
#[derive(Debug)]
pub enum Event {
    /// New text (possibly empty when only logprobs are new).
    Delta {
        text: String,
        logprobs: Vec<TokenLogprob>,
    },
    Done {
        finish_reason: FinishReason,
        usage: Usage,
    },
    Failed(ApiError),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    Stop,
    Length,
}

#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens whose KV came from a cached conversation instead of a prefill.
    pub cached_tokens: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

#[derive(Debug, Clone, Serialize)]
pub struct TokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<TopLogprob>,
}

/// The handle request handlers submit jobs through.
pub struct Engine {
    jobs: Option<Sender<Job>>,
    queued: Arc<AtomicUsize>,
    max_queue: usize,
    thread: Option<JoinHandle<()>>,
}

impl Engine {
    pub fn start(
        model: Arc<Model>,
        tokenizer: Arc<Tokenizer>,
        pool: ThreadPool,
        config: EngineConfig,
        metrics: Arc<Metrics>,
    ) -> std::io::Result<Self> {
        let (jobs, rx) = std::sync::mpsc::channel();
        let queued = Arc::new(AtomicUsize::new(0));
        let max_queue = config.max_queue;
        let state = EngineLoop {
            model,
            tokenizer,
            pool,
            config,
            metrics,
            queued: Arc::clone(&queued),
            waiting: VecDeque::new(),
            running: Vec::new(),
            cached: Vec::new(),
            scratch: Scratch::default(),
        };
        let thread = std::thread::Builder::new()
            .name("pyramid-engine".into())
            .spawn(move || state.run(rx))?;
        Ok(Self {
            jobs: Some(jobs),
            queued,
            max_queue,
            thread: Some(thread),
        })
    }

    /// Queues a job, or refuses it when the queue is full (429) or the engine is gone.
    pub fn submit(&self, job: Job) -> Result<(), ApiError> {
        let Some(jobs) = &self.jobs else {
            return Err(ApiError::shutting_down());
        };
        if self
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                (q < self.max_queue).then_some(q + 1)
            })
            .is_err()
        {
            return Err(ApiError::queue_full(1));
        }
        jobs.send(job).map_err(|_| {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            ApiError::shutting_down()
        })
    }

    /// Stops taking jobs and waits for the running ones to finish.
    pub fn shutdown(&mut self) {
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shutdown();
    }
}

struct Sequence {
    job: Job,
    session: Session,
    /// Prompt tokens fed so far (the first `cached_tokens` came with the session).
    fed: usize,
    cached_tokens: usize,
    /// The token to feed next step once the prompt is in.
    next_input: Option<u32>,
    sampler: Sampler,
    generated: usize,
    decoder: StreamDecoder,
    /// All text decoded so far, and how much of it has been sent.
    text: String,
    sent: usize,
    last_token_at: Option<Instant>,
}

struct Cached {
    session: Session,
    last_used: Instant,
}

struct EngineLoop {
    model: Arc<Model>,
    tokenizer: Arc<Tokenizer>,
    pool: ThreadPool,
    config: EngineConfig,
    metrics: Arc<Metrics>,
    queued: Arc<AtomicUsize>,
    waiting: VecDeque<Job>,
    running: Vec<Sequence>,
    cached: Vec<Cached>,
    scratch: Scratch,
}

impl EngineLoop {
    fn run(mut self, rx: Receiver<Job>) {
        let mut open = true;
        loop {
            if self.running.is_empty() && self.waiting.is_empty() {
                if !open {
                    return;
                }
                match rx.recv() {
                    Ok(job) => self.waiting.push_back(job),
                    Err(_) => return,
                }
            }
            loop {
                match rx.try_recv() {
                    Ok(job) => self.waiting.push_back(job),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        open = false;
                        break;
                    }
                }
            }
            self.drop_cancelled();
            self.admit();
            self.step();
            self.publish_gauges();
        }
    }

    fn drop_cancelled(&mut self) {
        let before = self.waiting.len();
        self.waiting.retain(|job| !job.events.is_closed());
        self.queued
            .fetch_sub(before - self.waiting.len(), Ordering::AcqRel);
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].job.events.is_closed() {
                let seq = self.running.swap_remove(i);
                self.metrics.cancelled.fetch_add(1, Ordering::Relaxed);
                self.retire(seq.session);
            } else {
                i += 1;
            }
        }
    }

    /// Moves waiting jobs into the batch while there is room, each onto the cached
    /// conversation sharing the longest prefix with its prompt, if any.
    fn admit(&mut self) {
        while self.running.len() < self.config.max_batch {
            let Some(job) = self.waiting.pop_front() else {
                break;
            };
            self.queued.fetch_sub(1, Ordering::AcqRel);
            let best = self
                .cached
                .iter()
                .enumerate()
                .map(|(i, c)| (i, common_prefix(c.session.tokens(), &job.prompt)))
                .max_by_key(|&(_, n)| n)
                .filter(|&(_, n)| n > 0);
            let (mut session, shared) = match best {
                Some((i, n)) => (self.cached.swap_remove(i).session, n),
                None => {
                    let Some(window) = self.window_for(job.prompt.len()) else {
                        // Handlers check the prompt against the largest window; this is a
                        // request that raced a smaller ladder, answered all the same.
                        let largest = self.config.ladder.largest();
                        let _ = job
                            .events
                            .send(Event::Failed(ApiError::context_length_exceeded(
                                job.prompt.len(),
                                largest,
                            )));
                        continue;
                    };
                    (
                        Session::with_kv_type(Arc::clone(&self.model), window, self.config.kv_type),
                        0,
                    )
                }
            };
            // The last prompt token always runs, for the logits the first sample needs.
            let reused = shared.min(job.prompt.len() - 1);
            session.truncate(reused);
            let sampler = match Sampler::new(job.sampler.clone()) {
                Ok(s) => s,
                Err(e) => {
                    let _ = job
                        .events
                        .send(Event::Failed(ApiError::invalid_request(e.to_string())));
                    self.retire(session);
                    continue;
                }
            };
            self.running.push(Sequence {
                job,
                session,
                fed: reused,
                cached_tokens: reused,
                next_input: None,
                sampler,
                generated: 0,
                decoder: StreamDecoder::new(),
                text: String::new(),
                sent: 0,
                last_token_at: None,
            });
        }
    }

    /// The smallest window of the ladder holding `len` positions.
    fn window_for(&self, len: usize) -> Option<usize> {
        let ladder = &self.config.ladder;
        ladder.rung_for(len).ok().map(|rung| ladder.windows()[rung])
    }

    /// One forward pass over the whole batch.
    fn step(&mut self) {
        let mut budget = self.config.prefill_chunk;
        // Which sequences take part, and how many tokens each feeds.
        let mut feeds: Vec<(usize, usize)> = Vec::with_capacity(self.running.len());
        for (i, seq) in self.running.iter().enumerate() {
            let left = seq.job.prompt.len() - seq.fed;
            if left > 0 {
                let n = left.min(budget);
                if n > 0 {
                    budget -= n;
                    feeds.push((i, n));
                }
            } else if seq.next_input.is_some() {
                feeds.push((i, 1));
            }
        }
        // Grow every window this step would overflow: the pyramid's migration.
        let mut failed = Vec::new();
        for &(i, n) in &feeds {
            let session = &mut self.running[i].session;
            let needed = session.tokens().len() + n;
            if needed > session.kv_cache().capacity() {
                let ladder = &self.config.ladder;
                let window = ladder.rung_for(needed).ok().map(|r| ladder.windows()[r]);
                let start = Instant::now();
                match window.map(|w| session.migrate(w)) {
                    Some(Ok(())) => self.metrics.record_migration(start.elapsed()),
                    _ => failed.push(i),
                }
            }
        }
        feeds.retain(|(i, _)| !failed.contains(i));
        if feeds.is_empty() {
            self.finish_all(&failed, FinishReason::Length);
            return;
        }
        let inputs: Vec<Vec<u32>> = feeds
            .iter()
            .map(|&(i, n)| {
                let seq = &self.running[i];
                match seq.next_input {
                    Some(token) if seq.fed == seq.job.prompt.len() => vec![token],
                    _ => seq.job.prompt[seq.fed..seq.fed + n].to_vec(),
                }
            })
            .collect();
        let n_decoding = feeds
            .iter()
            .filter(|&&(i, _)| self.running[i].fed == self.running[i].job.prompt.len())
            .count();
        let prefilled: usize = feeds
            .iter()
            .filter(|&&(i, _)| self.running[i].fed < self.running[i].job.prompt.len())
            .map(|&(_, n)| n)
            .sum();
        let feed_idx: Vec<usize> = feeds.iter().map(|&(i, _)| i).collect();
        let result = {
            let mut sessions = pick_mut(&mut self.running, &feed_idx);
            let mut session_refs: Vec<&mut Session> =
                sessions.iter_mut().map(|s| &mut s.session).collect();
            let input_refs: Vec<&[u32]> = inputs.iter().map(Vec::as_slice).collect();
            step_batch(
                &self.pool,
                &mut session_refs,
                &input_refs,
                &mut self.scratch,
            )
        };
        self.metrics
            .prefilled_tokens
            .fetch_add(prefilled as u64, Ordering::Relaxed);
        if n_decoding > 0 {
            self.metrics.observe_batch(n_decoding);
        }
        let logits = match result {
            Ok(logits) => logits,
            Err(e) => {
                // A model error fails the sequences of this step, never the server.
                for &i in &feed_idx {
                    let _ = self.running[i]
                        .job
                        .events
                        .send(Event::Failed(ApiError::internal(e.to_string())));
                }
                let mut doomed = feed_idx.clone();
                doomed.extend(&failed);
                self.remove(&doomed);
                return;
            }
        };
        let mut finished: Vec<(usize, FinishReason)> = Vec::new();
        for ((&(i, n), mut logits), _) in feeds.iter().zip(logits).zip(&inputs) {
            let seq = &mut self.running[i];
            if seq.fed < seq.job.prompt.len() {
                seq.fed += n;
                if seq.fed < seq.job.prompt.len() {
                    continue; // more prompt to come: these logits are not sampled
                }
            }
            if let Some(reason) = self.sample(i, &mut logits) {
                finished.push((i, reason));
            }
        }
        for i in failed {
            finished.push((i, FinishReason::Length));
        }
        self.finish(finished);
    }

    /// Samples the next token of sequence `i` and sends its text; `Some` when it ends.
    fn sample(&mut self, i: usize, logits: &mut [f32]) -> Option<FinishReason> {
        let tokenizer = Arc::clone(&self.tokenizer);
        let largest = self.config.ladder.largest();
        let seq = &mut self.running[i];
        let raw_logits = seq.job.logprobs.map(|k| (k, logits.to_vec()));
        let token = seq.sampler.sample(logits, seq.session.tokens());
        seq.generated += 1;
        self.metrics
            .generated_tokens
            .fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        match seq.last_token_at {
            None => self.metrics.observe_ttft(now - seq.job.submitted),
            Some(last) => self.metrics.observe_inter_token(now - last),
        }
        seq.last_token_at = Some(now);
        let logprobs: Vec<TokenLogprob> = raw_logits
            .map(|(k, raw)| token_logprobs(&tokenizer, &raw, k, token))
            .into_iter()
            .collect();
        if tokenizer.is_end_of_generation(token) {
            if !logprobs.is_empty() {
                let _ = seq.job.events.send(Event::Delta {
                    text: String::new(),
                    logprobs,
                });
            }
            return Some(FinishReason::Stop);
        }
        let piece = seq.decoder.push(&tokenizer, token).unwrap_or_default();
        seq.text.push_str(&piece);
        let stopped = release_text(&seq.text, seq.sent, &seq.job.stop);
        let text = seq.text[seq.sent..stopped.send_to].to_string();
        seq.sent = stopped.send_to;
        if !text.is_empty() || !logprobs.is_empty() {
            let _ = seq.job.events.send(Event::Delta { text, logprobs });
        }
        if stopped.hit {
            // The stop string and anything after it are never sent.
            seq.text.truncate(stopped.send_to);
            seq.decoder = StreamDecoder::new();
            return Some(FinishReason::Stop);
        }
        if seq.job.max_tokens.is_some_and(|max| seq.generated >= max) {
            return Some(FinishReason::Length);
        }
        // The next decode needs one more position; none is left in the largest window.
        if seq.session.tokens().len() + 1 > largest {
            return Some(FinishReason::Length);
        }
        seq.next_input = Some(token);
        None
    }

    fn finish(&mut self, mut finished: Vec<(usize, FinishReason)>) {
        finished.sort_by_key(|&(i, _)| std::cmp::Reverse(i));
        for (i, reason) in finished {
            let mut seq = self.running.swap_remove(i);
            // Whatever text was held back for a stop string that never came is sent now.
            let mut tail = seq.text[seq.sent..].to_string();
            tail.push_str(&seq.decoder.finish());
            if !tail.is_empty() {
                let _ = seq.job.events.send(Event::Delta {
                    text: tail,
                    logprobs: Vec::new(),
                });
            }
            let usage = Usage {
                prompt_tokens: seq.job.prompt.len(),
                completion_tokens: seq.generated,
                cached_tokens: seq.cached_tokens,
            };
            self.metrics.record_finished(&usage);
            let _ = seq.job.events.send(Event::Done {
                finish_reason: reason,
                usage,
            });
            self.retire(seq.session);
        }
    }

    fn finish_all(&mut self, idx: &[usize], reason: FinishReason) {
        self.finish(idx.iter().map(|&i| (i, reason)).collect());
    }

    fn remove(&mut self, idx: &[usize]) {
        let mut idx = idx.to_vec();
        idx.sort_unstable_by(|a, b| b.cmp(a));
        idx.dedup();
        for i in idx {
            let seq = self.running.swap_remove(i);
            self.retire(seq.session);
        }
    }

    /// Keeps a finished conversation for reuse, then evicts the least recently used ones
    /// beyond the session limit or the KV budget.
    fn retire(&mut self, session: Session) {
        if !session.tokens().is_empty() {
            self.cached.push(Cached {
                session,
                last_used: Instant::now(),
            });
        }
        self.cached.sort_by_key(|c| std::cmp::Reverse(c.last_used));
        let running_bytes: usize = self
            .running
            .iter()
            .map(|s| s.session.kv_cache().bytes())
            .sum();
        let max_cached = self.config.max_sessions.saturating_sub(self.running.len());
        let mut bytes = running_bytes;
        let mut keep = 0;
        for c in &self.cached {
            let b = c.session.kv_cache().bytes();
            if keep >= max_cached || bytes + b > self.config.kv_budget {
                break;
            }
            bytes += b;
            keep += 1;
        }
        self.cached.truncate(keep);
    }

    fn publish_gauges(&self) {
        let m = &self.metrics;
        m.queue_depth.store(
            self.queued.load(Ordering::Acquire) as u64,
            Ordering::Relaxed,
        );
        m.running
            .store(self.running.len() as u64, Ordering::Relaxed);
        m.cached_sessions
            .store(self.cached.len() as u64, Ordering::Relaxed);
        let kv: usize = self
            .running
            .iter()
            .map(|s| s.session.kv_cache().bytes())
            .chain(self.cached.iter().map(|c| c.session.kv_cache().bytes()))
            .sum();
        m.kv_bytes.store(kv as u64, Ordering::Relaxed);
    }
}

/// Mutable references to the elements of `items` at the distinct indices `idx`, in order.
fn pick_mut<'a, T>(items: &'a mut [T], idx: &[usize]) -> Vec<&'a mut T> {
    let mut slots: Vec<Option<&mut T>> = items.iter_mut().map(Some).collect();
    idx.iter()
        .map(|&i| slots[i].take().expect("indices are distinct"))
        .collect()
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// How far decoded text may be sent, given stop strings.
struct Release {
    send_to: usize,
    hit: bool,
}

/// Text up to the first stop string (which ends generation and is never sent), or else up
/// to the longest tail that could still grow into a stop string, which is held back.
fn release_text(text: &str, sent: usize, stops: &[String]) -> Release {
    // A stop can start before `sent` only if the held-back tail was shorter than it, which
    // the hold-back rule excludes; so searching from `sent` finds every complete one.
    let first_hit = stops
        .iter()
        .filter_map(|s| text[sent..].find(s.as_str()).map(|p| sent + p))
        .min();
    if let Some(at) = first_hit {
        return Release {
            send_to: at,
            hit: true,
        };
    }
    let hold = stops
        .iter()
        .map(|s| {
            (1..s.len().min(text.len() - sent + 1))
                .rev()
                .find(|&l| {
                    s.is_char_boundary(l)
                        && text.is_char_boundary(text.len() - l)
                        && text.ends_with(&s[..l])
                })
                .unwrap_or(0)
        })
        .max()
        .unwrap_or(0);
    Release {
        send_to: text.len() - hold,
        hit: false,
    }
}

/// `token`'s log-probability under `logits` (the model's distribution, before sampling
/// reshapes it) and the `k` most likely tokens'.
fn token_logprobs(tokenizer: &Tokenizer, logits: &[f32], k: usize, token: u32) -> TokenLogprob {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let log_sum = logits
        .iter()
        .map(|&l| f64::from(l - max).exp())
        .sum::<f64>()
        .ln() as f32
        + max;
    let entry = |id: u32| {
        let bytes = tokenizer.token_bytes(id).unwrap_or_default().to_vec();
        TopLogprob {
            token: String::from_utf8_lossy(&bytes).into_owned(),
            logprob: logits[id as usize] - log_sum,
            bytes,
        }
    };
    let by_logit = |a: &u32, b: &u32| logits[*b as usize].total_cmp(&logits[*a as usize]);
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    if k > 0 && k < order.len() {
        order.select_nth_unstable_by(k - 1, by_logit);
    }
    order.truncate(k);
    order.sort_by(by_logit);
    let TopLogprob {
        token,
        logprob,
        bytes,
    } = entry(token);
    TokenLogprob {
        token,
        logprob,
        bytes,
        top_logprobs: order.into_iter().map(entry).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn release(text: &str, sent: usize, stops: &[&str]) -> (usize, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let r = release_text(text, sent, &stops);
        (r.send_to, r.hit)
    }

    #[test]
    fn stop_strings_are_found_across_pieces_and_never_sent() {
        assert_eq!(
            release("Hello wor", 0, &["world!"]),
            (6, false),
            "'wor' may become 'world!'"
        );
        assert_eq!(release("Hello world!", 6, &["world!"]), (6, true));
        assert_eq!(release("abc", 0, &[]), (3, false));
        assert_eq!(
            release("a\nb", 0, &["\n", "b"]),
            (1, true),
            "the first stop wins"
        );
        assert_eq!(release("xEN", 1, &["END", "ENX"]), (1, false));
        // Held-back tails end on character boundaries.
        assert_eq!(release("caf\u{e9}", 0, &["\u{e9}t\u{e9}"]), (3, false));
        assert_eq!(release("x\u{e9}", 0, &["\u{e9}"]), (1, true));
    }

    #[test]
    fn pick_mut_follows_the_indices() {
        let mut v = [10, 20, 30];
        let picked = pick_mut(&mut v, &[2, 0]);
        assert_eq!(picked.iter().map(|x| **x).collect::<Vec<_>>(), [30, 10]);
    }
}
