//! A small thread pool for the matmuls of one model: the caller and N−1
//! workers split a job's tasks through an atomic counter. Workers spin
//! briefly between jobs (a decode step dispatches hundreds of jobs per token)
//! and then sleep, so an idle engine costs no CPU.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

type Task<'a> = &'a (dyn Fn(usize) + Sync);

struct Shared {
    /// The current job, lifetime erased. INVARIANT: only read between an
    /// epoch bump and the `done` count reaching the worker count; `run`
    /// does not return (so the borrow stays alive) before that.
    job: Mutex<Option<Task<'static>>>,
    tasks: AtomicUsize,
    next: AtomicUsize,
    done: AtomicUsize,
    epoch: AtomicU64,
    stop: AtomicBool,
    sleep: Mutex<()>,
    wake: Condvar,
}

/// The pool. `threads` counts the calling thread.
pub struct Pool {
    threads: usize,
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").field("threads", &self.threads).finish()
    }
}

/// Spin iterations before a worker sleeps (about a millisecond).
const SPIN: u32 = 1 << 17;

impl Pool {
    /// A pool of `threads` threads in all (at least 1).
    pub fn new(threads: usize) -> Pool {
        let threads = threads.max(1);
        let shared = Arc::new(Shared {
            job: Mutex::new(None),
            tasks: AtomicUsize::new(0),
            next: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            epoch: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            sleep: Mutex::new(()),
            wake: Condvar::new(),
        });
        let workers = (1..threads)
            .map(|i| {
                let s = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("agentd-mm-{i}"))
                    .spawn(move || worker(&s))
                    .expect("spawning a matmul thread")
            })
            .collect();
        Pool { threads, shared, workers }
    }

    /// Threads in all.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `f(i)` for every `i` in `0..tasks`, spread over the pool; returns
    /// when all are done.
    pub fn run(&self, tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        if self.threads == 1 || tasks <= 1 {
            (0..tasks).for_each(f);
            return;
        }
        let s = &*self.shared;
        // SAFETY: the erased borrow is used only until `done` reaches the
        // worker count below, and this function does not return before.
        let job: Task<'static> = unsafe { std::mem::transmute::<Task<'_>, Task<'static>>(f) };
        *s.job.lock().unwrap_or_else(|e| e.into_inner()) = Some(job);
        s.tasks.store(tasks, Ordering::Relaxed);
        s.next.store(0, Ordering::Relaxed);
        s.done.store(0, Ordering::Relaxed);
        {
            let _g = s.sleep.lock().unwrap_or_else(|e| e.into_inner());
            s.epoch.fetch_add(1, Ordering::Release);
            s.wake.notify_all();
        }
        drain(s, f);
        let workers = self.threads - 1;
        let mut spins = 0u32;
        while s.done.load(Ordering::Acquire) < workers {
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(1024) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        *s.job.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

fn drain(s: &Shared, f: Task<'_>) {
    let tasks = s.tasks.load(Ordering::Relaxed);
    loop {
        let i = s.next.fetch_add(1, Ordering::Relaxed);
        if i >= tasks {
            break;
        }
        f(i);
    }
}

fn worker(s: &Shared) {
    let mut seen = 0u64;
    loop {
        let mut spins = 0u32;
        loop {
            if s.stop.load(Ordering::Acquire) {
                return;
            }
            if s.epoch.load(Ordering::Acquire) != seen {
                break;
            }
            spins += 1;
            if spins < SPIN {
                std::hint::spin_loop();
                continue;
            }
            let g = s.sleep.lock().unwrap_or_else(|e| e.into_inner());
            if s.epoch.load(Ordering::Acquire) == seen && !s.stop.load(Ordering::Acquire) {
                drop(s.wake.wait(g).unwrap_or_else(|e| e.into_inner()));
            }
        }
        seen = s.epoch.load(Ordering::Acquire);
        let job = *s.job.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(job) = job {
            drain(s, job);
        }
        s.done.fetch_add(1, Ordering::Release);
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        {
            let _g = self.shared.sleep.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.stop.store(true, Ordering::Release);
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_once() {
        let pool = Pool::new(3);
        for n in [0usize, 1, 2, 7, 1000] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            pool.run(n, &|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
        }
    }
}
