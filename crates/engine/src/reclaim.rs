//! Memory given back off the engine thread.
//!
//! Dropping a conversation frees its KV cache: hundreds of megabytes for a few thousand
//! tokens of a 0.5B model, which the allocator hands back to the kernel page by page.
//! On the engine thread that is a stall of every stream for as long, so what leaves
//! memory without being written is dropped on a thread of its own (`pyramid-free`,
//! started on first use, at the lowest priority).

use std::any::Any;
use std::sync::mpsc::{self, Sender};
use std::thread::JoinHandle;

/// Anything the thread may drop.
type Garbage = Box<dyn Any + Send>;

/// Drops values on its thread.
#[derive(Default)]
pub(crate) struct Reclaimer {
    thread: Option<(Sender<Garbage>, JoinHandle<()>)>,
}

impl Reclaimer {
    /// Drops `value` on the reclaiming thread (here, if that thread cannot start).
    pub fn release<T: Send + 'static>(&mut self, value: T) {
        if self.thread.is_none() {
            let (tx, rx) = mpsc::channel::<Garbage>();
            let spawned = std::thread::Builder::new()
                .name("pyramid-free".into())
                .spawn(move || {
                    lower_priority();
                    rx.into_iter().for_each(drop);
                });
            if let Ok(handle) = spawned {
                self.thread = Some((tx, handle));
            }
        }
        match &self.thread {
            Some((tx, _)) => {
                // The thread only ends when this sender is dropped.
                let _ = tx.send(Box::new(value));
            }
            None => drop(value),
        }
    }
}

impl Drop for Reclaimer {
    /// Waits for what was handed over to be freed, so memory is back when the engine is.
    fn drop(&mut self) {
        if let Some((tx, handle)) = self.thread.take() {
            drop(tx);
            let _ = handle.join();
        }
    }
}

/// Makes this thread yield the cores to the engine's: memory freed or a file written a
/// little later costs nothing, a decode step delayed costs every stream.
pub(crate) fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: plain syscalls on this thread's own id; no memory is passed.
        unsafe {
            let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
            libc::setpriority(libc::PRIO_PROCESS, tid, 19);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;

    struct Counted(Arc<AtomicUsize>, std::thread::ThreadId);

    impl Drop for Counted {
        fn drop(&mut self) {
            assert_ne!(
                std::thread::current().id(),
                self.1,
                "dropped on the caller's thread"
            );
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn values_are_dropped_on_another_thread_and_all_by_the_time_it_is_gone() {
        let dropped = Arc::new(AtomicUsize::new(0));
        let mut reclaimer = Reclaimer::default();
        for _ in 0..5 {
            reclaimer.release(Counted(Arc::clone(&dropped), std::thread::current().id()));
        }
        drop(reclaimer);
        assert_eq!(dropped.load(Ordering::SeqCst), 5);
    }
}
