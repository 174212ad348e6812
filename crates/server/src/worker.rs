//! The engine thread: it owns the engine core and the thread pool, feeds the core the
//! requests handlers submit, steps it, and turns its token events into text.
//!
//! The core ([`pyramid_engine::Engine`]) does tokens: continuous batching, chunked
//! prefill, conversation reuse, the window pyramid on the route's artifacts. This thread
//! does what is about text: streaming detokenisation, stop strings (matched across token
//! boundaries; the request is aborted in the core when one matches), log-probabilities
//! as token strings, and the metrics. A request whose client went away (its channel
//! closed) is aborted on the next step.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pyramid_engine::{
    Engine as Core, EngineError, Event as CoreEvent, FinishReason, Pooling, Request, RequestId,
    Speculation, TokenLogprobs, Usage,
};
use pyramid_grammar::Constraint;
use pyramid_kernels::ThreadPool;
use pyramid_runtime::SamplerConfig;
use pyramid_tokenizer::{StreamDecoder, Tokenizer};
use serde::Serialize;

use crate::engine_view::{EngineWatch, Publisher};
use crate::error::ApiError;
use crate::metrics::{lock, Metrics};
use crate::outbox::Outbox;
use crate::stop::release_text;

/// How often an idle engine thread retries events held for slow readers.
const RETRY_HELD: Duration = Duration::from_millis(5);

/// A tokenised request, ready for the engine.
pub struct Job {
    pub prompt: Vec<u32>,
    pub max_tokens: Option<usize>,
    pub sampler: SamplerConfig,
    pub stop: Vec<String>,
    /// Strings that end generation after them, kept in the text (a tool call's closing
    /// tag when only one call is allowed).
    pub end_after: Vec<String>,
    /// The model's end tokens do not end the reply (`ignore_eos`).
    pub ignore_eos: bool,
    /// More tokens that end the reply, their text not sent (`stop_token_ids`).
    pub stop_token_ids: Vec<u32>,
    /// End tokens are held back until the reply has this many tokens (`min_tokens`).
    pub min_tokens: usize,
    pub logprobs: Option<usize>,
    /// The grammar the reply follows, compiled for this request.
    pub constraint: Option<Constraint>,
    /// The request field holding the prompt (`messages` or `prompt`), named by errors
    /// about it.
    pub prompt_param: &'static str,
    /// Where its events go (see [`crate::outbox`]).
    pub events: Outbox,
    pub submitted: Instant,
    /// Lower is more urgent (the engine's convention).
    pub priority: i32,
    pub speculation: Speculation,
    /// Tokens the reply is expected to contain (`prediction`), drafted from.
    pub prediction: Vec<u32>,
    /// An embedding of the prompt rather than a reply, pooled so.
    pub pooling: Option<Pooling>,
}

impl Job {
    /// The embedding of `prompt` (the request field `input`), its events on `events`.
    pub fn embedding(prompt: Vec<u32>, pooling: Pooling, priority: i32, events: Outbox) -> Self {
        Self {
            prompt,
            max_tokens: Some(0),
            sampler: SamplerConfig::greedy(),
            stop: Vec::new(),
            end_after: Vec::new(),
            ignore_eos: false,
            stop_token_ids: Vec::new(),
            min_tokens: 0,
            logprobs: None,
            constraint: None,
            prompt_param: "input",
            events,
            submitted: Instant::now(),
            priority,
            speculation: Speculation::Off,
            prediction: Vec::new(),
            pooling: Some(pooling),
        }
    }
}

/// What the engine thread tells a request's handler.
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
        /// The stop string that ended the reply, if one did.
        stop_sequence: Option<String>,
        /// An embedding request's vector.
        embedding: Option<Vec<f32>>,
    },
    Failed(ApiError),
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
pub struct EngineThread {
    /// Taken at shutdown: new jobs are refused from then on.
    jobs: Mutex<Option<Sender<Job>>>,
    /// Whether the engine drafts for requests that ask (`--speculative`).
    speculates: bool,
    /// Whether the route runs embedding requests.
    embeds: bool,
    queued: Arc<AtomicUsize>,
    max_queue: usize,
    /// Set when the shutdown grace is over: every request still running ends.
    ending: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// What the engine thread publishes for the engine view.
    view: Arc<EngineWatch>,
}

impl EngineThread {
    /// Starts the thread that drives `core` on `pool`; at most `max_queue` requests wait.
    pub fn start(
        mut core: Core,
        tokenizer: Arc<Tokenizer>,
        pool: ThreadPool,
        max_queue: usize,
        metrics: Arc<Metrics>,
    ) -> std::io::Result<Self> {
        let (jobs, rx) = std::sync::mpsc::channel();
        let queued = Arc::new(AtomicUsize::new(0));
        let ending = Arc::new(AtomicBool::new(false));
        metrics.watch_pyramid(Arc::clone(core.pyramid()));
        metrics.publish_engine(core.stats());
        let speculates = core.speculates();
        let embeds = core.embeds();
        let (publisher, view) = Publisher::new(&mut core);
        let worker = Worker {
            view: publisher,
            stop_tokens: tokenizer.end_of_generation_ids().to_vec(),
            suppressed_tokens: tokenizer.suppressed_ids().into(),
            core,
            tokenizer,
            pool,
            metrics,
            queued: Arc::clone(&queued),
            ending: Arc::clone(&ending),
            live: HashMap::new(),
            retired: Vec::new(),
            next_id: 0,
        };
        let thread = std::thread::Builder::new()
            .name("pyramid-engine".into())
            .spawn(move || worker.run(rx))?;
        Ok(Self {
            jobs: Mutex::new(Some(jobs)),
            speculates,
            embeds,
            queued,
            max_queue,
            ending,
            thread: Mutex::new(Some(thread)),
            view,
        })
    }

    /// The engine view's snapshots and timeline.
    pub fn view(&self) -> &EngineWatch {
        &self.view
    }

    /// Whether new jobs are still taken (not shutting down).
    pub fn is_admitting(&self) -> bool {
        lock(&self.jobs).is_some()
    }

    /// Whether requests can verify drafts: the server's `--speculative`, on a route whose
    /// passes return logits for every drafted position.
    pub fn speculates(&self) -> bool {
        self.speculates
    }

    /// Whether embedding jobs can run on this route (see [`Core::embeds`]).
    pub fn embeds(&self) -> bool {
        self.embeds
    }

    /// The most jobs that can wait at once (`--max-queue`).
    pub fn max_queue(&self) -> usize {
        self.max_queue
    }

    /// Queues a job, or refuses it when the queue is full (429) or the engine is gone.
    /// Whether the engine thread is still running (it ends only at shutdown or if it
    /// panicked).
    pub fn is_alive(&self) -> bool {
        lock(&self.thread)
            .as_ref()
            .is_some_and(|t| !t.is_finished())
    }

    pub fn submit(&self, job: Job) -> Result<(), ApiError> {
        let jobs = lock(&self.jobs);
        let Some(jobs) = jobs.as_ref() else {
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

    /// Refuses new jobs (503) from now on; the running ones go on.
    pub fn stop_admitting(&self) {
        lock(&self.jobs).take();
    }

    /// Ends every request still running or queued, each with a final error event saying
    /// the server is shutting down (the grace for them to finish is over).
    pub fn end_all(&self) {
        self.stop_admitting();
        self.ending.store(true, Ordering::Release);
    }

    /// Refuses new jobs and waits for the engine thread to finish the running ones and
    /// write every conversation it holds to the session directory, if there is one.
    pub fn shutdown(&self) {
        self.stop_admitting();
        let thread = lock(&self.thread).take();
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }
}

impl Drop for EngineThread {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A request's text side.
struct Live {
    job: Job,
    /// Still counted in the queue (not admitted by the core yet).
    queued: bool,
    generated: usize,
    decoder: StreamDecoder,
    /// All text decoded so far, and how much of it has been sent.
    text: String,
    sent: usize,
    last_token_at: Option<Instant>,
    /// A stop string matched in a token the core had already ended the request on: its
    /// `Finished` event, which carries the usage, is still to come.
    stopped: bool,
    /// The stop string that ended the reply.
    stop_sequence: Option<String>,
    /// An embedding request's vector, sent with its `Done`.
    embedding: Option<Vec<f32>>,
}

struct Worker {
    core: Core,
    tokenizer: Arc<Tokenizer>,
    stop_tokens: Vec<u32>,
    suppressed_tokens: Arc<[u32]>,
    pool: ThreadPool,
    metrics: Arc<Metrics>,
    queued: Arc<AtomicUsize>,
    ending: Arc<AtomicBool>,
    live: HashMap<RequestId, Live>,
    /// Outboxes of ended requests whose readers have not taken everything yet.
    retired: Vec<Outbox>,
    next_id: RequestId,
    view: Publisher,
}

impl Worker {
    fn run(mut self, rx: Receiver<Job>) {
        let mut open = true;
        loop {
            self.report_warnings();
            self.flush_outboxes();
            if !self.core.has_work() {
                if !open {
                    return self.shut_down();
                }
                self.view.settle(&mut self.core);
                // Outboxes still holding events are retried while waiting for work, and
                // a watched engine keeps its view current.
                let wait = if self.retired.is_empty() {
                    self.view.idle_wait(&self.core)
                } else {
                    Some(RETRY_HELD)
                };
                let job = match wait {
                    None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
                    Some(wait) => rx.recv_timeout(wait),
                };
                match job {
                    Ok(job) => self.add(job),
                    Err(RecvTimeoutError::Timeout) => {
                        self.view.tick(&mut self.core);
                        continue;
                    }
                    Err(RecvTimeoutError::Disconnected) => return self.shut_down(),
                }
            }
            loop {
                match rx.try_recv() {
                    Ok(job) => self.add(job),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        open = false;
                        break;
                    }
                }
            }
            self.abort_cancelled();
            if self.ending.load(Ordering::Acquire) {
                self.end_all();
            }
            let events = self.core.step(&self.pool);
            self.record_step();
            // Published before the events go out, so a client that reads /metrics right
            // after its reply sees its request gone from the running ones.
            self.metrics.publish_engine(self.core.stats());
            for event in events {
                let id = event.id();
                // Text work is per request (detokenising, stop strings, log-probabilities):
                // a defect hit there fails that request, not the engine thread.
                let handled = catch_unwind(AssertUnwindSafe(|| self.handle(event)));
                if let Err(payload) = handled {
                    self.fail_after_panic(id, &*payload);
                }
            }
            self.view.after_step(&mut self.core);
        }
    }

    /// Every request has ended: cached conversations go to the session store, if there
    /// is one, so a restarted server resumes them.
    fn shut_down(mut self) {
        let saved = self.core.save_cached();
        if saved > 0 {
            eprintln!("pyramid serve: kept {saved} conversations in the session directory");
        }
        self.report_warnings();
    }

    /// The engine's messages about session files, on stderr.
    fn report_warnings(&mut self) {
        for warning in self.core.take_warnings() {
            eprintln!("pyramid serve: warning: {warning}");
        }
    }

    fn add(&mut self, mut job: Job) {
        let id = self.next_id;
        self.next_id += 1;
        // Without a limit, generation ends when the largest window is full.
        let max_tokens = job.max_tokens.unwrap_or(usize::MAX);
        let mut stop_tokens = if job.ignore_eos {
            Vec::new()
        } else {
            self.stop_tokens.clone()
        };
        stop_tokens.extend(&job.stop_token_ids);
        let request = match job.pooling {
            Some(pooling) => Request {
                priority: job.priority,
                ..Request::embedding(id, std::mem::take(&mut job.prompt), pooling)
            },
            None => Request {
                id,
                // The core owns the prompt from here; the text side never reads it.
                prompt: std::mem::take(&mut job.prompt),
                max_tokens,
                sampler: job.sampler.clone(),
                stop_tokens,
                suppressed_tokens: Arc::clone(&self.suppressed_tokens),
                min_tokens: job.min_tokens,
                logprobs: job.logprobs,
                constraint: job.constraint.take(),
                priority: job.priority,
                speculation: job.speculation,
                prediction: std::mem::take(&mut job.prediction),
                pooling: None,
            },
        };
        self.core.add_request(request);
        self.live.insert(
            id,
            Live {
                job,
                queued: true,
                generated: 0,
                decoder: StreamDecoder::new(),
                text: String::new(),
                sent: 0,
                last_token_at: None,
                stopped: false,
                stop_sequence: None,
                embedding: None,
            },
        );
    }

    fn abort_cancelled(&mut self) {
        let gone: Vec<RequestId> = self
            .live
            .iter()
            .filter(|(_, l)| l.job.events.is_closed())
            .map(|(&id, _)| id)
            .collect();
        for id in gone {
            self.core.abort(id);
            if let Some(live) = self.remove(id) {
                if !live.queued {
                    self.metrics.cancelled.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// Ends request `id`, whose text work panicked: a 500 naming an internal error.
    fn fail_after_panic(&mut self, id: RequestId, payload: &(dyn std::any::Any + Send)) {
        let message = pyramid_engine::panic_message(payload);
        tracing::error!("request {id} failed on an internal error: {message}");
        self.core.abort(id);
        if let Some(mut live) = self.remove(id) {
            let error = ApiError::internal(format!("internal error: {message}"));
            live.job.events.send(Event::Failed(error));
            self.retire(live.job.events);
        }
    }

    /// Ends every request with the shutting-down error; their sessions stay cached, so
    /// they are saved with the others.
    fn end_all(&mut self) {
        let ids: Vec<RequestId> = self.live.keys().copied().collect();
        for id in ids {
            self.core.abort(id);
            if let Some(mut live) = self.remove(id) {
                live.job
                    .events
                    .send(Event::Failed(ApiError::shutting_down()));
                self.retire(live.job.events);
            }
        }
    }

    /// Forgets a request, leaving the queue count right.
    fn remove(&mut self, id: RequestId) -> Option<Live> {
        let live = self.live.remove(&id)?;
        if live.queued {
            self.queued.fetch_sub(1, Ordering::AcqRel);
        }
        Some(live)
    }

    fn record_step(&self) {
        let step = self.core.last_step();
        self.metrics
            .prefilled_tokens
            .fetch_add(step.n_prefilled as u64, Ordering::Relaxed);
        if step.n_decoded > 0 {
            self.metrics.observe_batch(step.n_decoded);
        }
        for &took in &step.migrations {
            self.metrics.record_migration(took);
        }
    }

    fn handle(&mut self, event: CoreEvent) {
        match event {
            CoreEvent::Started { id, .. } => {
                if let Some(live) = self.live.get_mut(&id) {
                    if std::mem::take(&mut live.queued) {
                        self.queued.fetch_sub(1, Ordering::AcqRel);
                    }
                }
            }
            CoreEvent::Token {
                id,
                token,
                logprobs,
            } => self.token(id, token, logprobs),
            CoreEvent::Finished {
                id, reason, usage, ..
            } => {
                if let Some(live) = self.remove(id) {
                    let reason = if live.stopped {
                        FinishReason::Stop
                    } else {
                        reason
                    };
                    self.finish(live, reason, usage);
                }
            }
            CoreEvent::Embedding { id, embedding } => {
                if let Some(live) = self.live.get_mut(&id) {
                    live.embedding = Some(embedding);
                }
            }
            CoreEvent::Failed { id, error } => {
                if let Some(mut live) = self.remove(id) {
                    let failure = api_error(&error, live.job.prompt_param);
                    live.job.events.send(Event::Failed(failure));
                    self.retire(live.job.events);
                }
            }
        }
    }

    /// A sampled token: its text, held back while it could still become a stop string.
    fn token(&mut self, id: RequestId, token: u32, logprobs: Option<TokenLogprobs>) {
        let tokenizer = Arc::clone(&self.tokenizer);
        let Some(live) = self.live.get_mut(&id).filter(|l| !l.stopped) else {
            return;
        };
        #[cfg(test)]
        inject::panic_in_text(live.job.priority);
        live.generated += 1;
        self.metrics
            .generated_tokens
            .fetch_add(1, Ordering::Relaxed);
        self.view.token(live.job.priority);
        let now = Instant::now();
        match live.last_token_at {
            None => {
                let ttft = now - live.job.submitted;
                self.metrics.observe_ttft(live.job.priority, ttft);
                self.view.first_token(live.job.priority, ttft);
            }
            Some(last) => self
                .metrics
                .observe_inter_token(live.job.priority, now - last),
        }
        live.last_token_at = Some(now);
        let logprobs: Vec<TokenLogprob> = logprobs
            .map(|lp| token_logprob(&tokenizer, token, &lp))
            .into_iter()
            .collect();
        if tokenizer.is_end_of_generation(token) || live.job.stop_token_ids.contains(&token) {
            // The core finishes the request with `stop` (or, ignoring end tokens, goes
            // on); the token has no text.
            if !logprobs.is_empty() {
                live.job.events.send(Event::Delta {
                    text: String::new(),
                    logprobs,
                });
            }
            return;
        }
        let piece = live.decoder.push(&tokenizer, token).unwrap_or_default();
        live.text.push_str(&piece);
        let stopped = release_text(&live.text, live.sent, &live.job.stop, &live.job.end_after);
        let text = live.text[live.sent..stopped.send_to].to_string();
        live.sent = stopped.send_to;
        if !text.is_empty() || !logprobs.is_empty() {
            live.job.events.send(Event::Delta { text, logprobs });
        }
        if stopped.hit {
            live.stop_sequence = stopped.stop;
            // The stop string and anything after it are never sent.
            live.text.truncate(stopped.send_to);
            live.decoder = StreamDecoder::new();
            match self.core.abort(id) {
                Some(usage) => {
                    self.metrics.publish_engine(self.core.stats());
                    if let Some(live) = self.remove(id) {
                        self.finish(live, FinishReason::Stop, usage);
                    }
                }
                // The same step ended it (its grammar or a limit): `Finished` follows.
                None => live.stopped = true,
            }
        }
    }

    fn finish(&mut self, mut live: Live, reason: FinishReason, usage: Usage) {
        // Whatever text was held back for a stop string that never came is sent now.
        let mut tail = live.text[live.sent..].to_string();
        tail.push_str(&live.decoder.finish());
        if !tail.is_empty() {
            live.job.events.send(Event::Delta {
                text: tail,
                logprobs: Vec::new(),
            });
        }
        self.metrics.record_finished(&usage);
        self.view.finished(live.job.priority);
        live.job.events.send(Event::Done {
            finish_reason: reason,
            usage,
            stop_sequence: live.stop_sequence.take(),
            embedding: live.embedding.take(),
        });
        self.retire(live.job.events);
    }

    /// Keeps the outbox of a request that has ended until its last events are in its
    /// queue.
    fn retire(&mut self, mut events: Outbox) {
        if !events.flush() {
            self.retired.push(events);
        }
    }

    /// Moves held events into their queues where readers made room.
    fn flush_outboxes(&mut self) {
        for live in self.live.values_mut() {
            live.job.events.flush();
        }
        self.retired.retain_mut(|events| !events.flush());
    }
}

/// The engine's refusal of a request as the API answers it.
fn api_error(error: &EngineError, prompt_param: &'static str) -> ApiError {
    match error {
        EngineError::Runtime(pyramid_runtime::RuntimeError::BadSamplingParameter { .. })
        | EngineError::BadRequest(_)
        | EngineError::EmptyPrompt => ApiError::invalid_request(error.to_string()),
        EngineError::OverBudget { .. } => ApiError::bad_param(
            prompt_param,
            format!("{error}: the server's --kv-budget cannot hold this request"),
        ),
        EngineError::Runtime(pyramid_runtime::RuntimeError::BeyondLargestWindow {
            needed,
            largest,
        }) => ApiError::context_length_exceeded(prompt_param, *needed, *largest),
        _ => ApiError::internal(error.to_string()),
    }
}

/// A sampled token's log-probabilities with their tokens as text and bytes.
fn token_logprob(tokenizer: &Tokenizer, token: u32, lp: &TokenLogprobs) -> TokenLogprob {
    let entry = |id: u32, logprob: f32| {
        let bytes = tokenizer.token_bytes(id).unwrap_or_default().to_vec();
        TopLogprob {
            token: String::from_utf8_lossy(&bytes).into_owned(),
            logprob,
            bytes,
        }
    };
    let TopLogprob {
        token,
        logprob,
        bytes,
    } = entry(token, lp.logprob);
    TokenLogprob {
        token,
        logprob,
        bytes,
        top_logprobs: lp.top.iter().map(|&(id, l)| entry(id, l)).collect(),
    }
}

/// A test hook: a panic injected into the text work, on the engine thread, of requests
/// at one priority (which a test sets on the request it picks).
#[cfg(test)]
pub(crate) mod inject {
    use std::sync::atomic::{AtomicI32, Ordering};

    static PANIC_AT_PRIORITY: AtomicI32 = AtomicI32::new(i32::MIN);

    pub(crate) fn panic_in_text_at(priority: i32) {
        PANIC_AT_PRIORITY.store(priority, Ordering::Release);
    }

    pub(super) fn panic_in_text(priority: i32) {
        if PANIC_AT_PRIORITY.load(Ordering::Acquire) == priority {
            panic!("injected panic in the text of a request at priority {priority}");
        }
    }
}
