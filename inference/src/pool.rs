//! A small thread pool for the matmuls of one model: the caller and N−1
//! workers claim a job's tasks one by one. Workers spin briefly between jobs
//! (a decode step dispatches hundreds of jobs per token) and then sleep, so
//! an idle engine costs no CPU.
//!
//! A task is claimed with a compare-and-swap on `(epoch, next index)`, so a
//! worker can only run a task of the job it read; the caller waits for the
//! tasks that were claimed, never for workers that were not scheduled in
//! time (on a busy machine a worker may wake after the caller has done
//! everything itself, and then it finds nothing to claim).
//!
//! INVARIANT (soundness of the lifetime erasure in [`Pool::run`]): the job
//! closure is called only for a claimed task, a task can only be claimed
//! while its job's epoch is current and its index is below that job's own
//! task count (read with the closure, from one slot), and `run` neither
//! returns nor unwinds before every claimed task has finished. A panic in a
//! task — the caller's or a worker's — is held until then and re-raised by
//! `run`. Workers hold the closure only as a raw pointer, turned into a
//! reference for the call of a claimed task and never outside it, so no
//! reference to it outlives `run`.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// The closure of a job, lifetime erased (see the module INVARIANT): valid
/// while a task of its job is claimed and not finished.
type Erased = *const (dyn Fn(usize) + Sync + 'static);

/// A job as the workers read it: its epoch, task count and closure, always
/// together.
#[derive(Clone, Copy)]
struct Job {
    epoch: u64,
    tasks: u64,
    f: Erased,
}

// SAFETY: `f` points to a `Sync` closure, so calling it from another thread
// is allowed; when it may be called is the module INVARIANT.
unsafe impl Send for Job {}

struct Shared {
    /// The current job (see the module INVARIANT).
    job: Mutex<Option<Job>>,
    /// `epoch << 32 | next task index`.
    state: AtomicU64,
    finished: AtomicUsize,
    /// A worker's task panicked during the current job.
    panicked: AtomicBool,
    stop: AtomicBool,
    sleep: Mutex<()>,
    wake: Condvar,
}

/// The pool. `threads` counts the calling thread.
pub struct Pool {
    threads: usize,
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// `run` is not reentrant: one job at a time.
    busy: Mutex<()>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").field("threads", &self.threads).finish()
    }
}

/// Spin iterations before a worker sleeps (about a millisecond).
#[cfg(not(miri))]
const SPIN: u32 = 1 << 17;
/// Miri runs every spin: sleep soon.
#[cfg(miri)]
const SPIN: u32 = 8;

impl Shared {
    /// Claims and runs tasks of `job` until none is left. Returns the
    /// payload of a panic of one of them, if any.
    ///
    /// # Safety
    ///
    /// `job.f` was valid when `job` was read from `self.job` (or it is the
    /// caller's own closure, alive for this call): it is dereferenced only
    /// for a task claimed under `job.epoch`, which keeps `run` — and the
    /// closure — alive until that task finishes.
    unsafe fn drain(&self, job: Job) -> Option<Box<dyn std::any::Any + Send>> {
        let Job { epoch, tasks, f } = job;
        let mut caught = None;
        let mut cur = self.state.load(Ordering::Acquire);
        loop {
            if cur >> 32 != epoch || (cur & 0xFFFF_FFFF) >= tasks {
                return caught;
            }
            match self.state.compare_exchange_weak(
                cur,
                cur + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    let i = (cur & 0xFFFF_FFFF) as usize;
                    // SAFETY: task `i` of `epoch` is claimed and not
                    // finished, so `run` of this job has not returned and
                    // its closure is alive (module INVARIANT).
                    let job = unsafe { &*f };
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(i)));
                    if let Err(p) = r {
                        // Before `finished` counts it, so the caller that
                        // sees every task finished also sees the panic.
                        self.panicked.store(true, Ordering::Release);
                        caught.get_or_insert(p);
                    }
                    self.finished.fetch_add(1, Ordering::AcqRel);
                    cur = self.state.load(Ordering::Acquire);
                }
                Err(now) => cur = now,
            }
        }
    }
}

impl Pool {
    /// A pool of `threads` threads in all (at least 1).
    pub fn new(threads: usize) -> Pool {
        let threads = threads.max(1);
        let shared = Arc::new(Shared {
            job: Mutex::new(None),
            state: AtomicU64::new(0),
            finished: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            sleep: Mutex::new(()),
            wake: Condvar::new(),
        });
        let mut workers = Vec::with_capacity(threads - 1);
        for i in 1..threads {
            let s = Arc::clone(&shared);
            match std::thread::Builder::new()
                .name(format!("agentd-mm-{i}"))
                .spawn(move || worker(&s))
            {
                Ok(h) => workers.push(h),
                // Fewer threads than asked is slower, not wrong.
                Err(_) => break,
            }
        }
        let threads = workers.len() + 1;
        Pool { threads, shared, workers, busy: Mutex::new(()) }
    }

    /// Threads in all.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `f(i)` for every `i` in `0..tasks`, spread over the pool; returns
    /// when all are done. A panic of any task is re-raised here, after every
    /// other claimed task has finished.
    pub fn run(&self, tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        if self.threads == 1 || tasks <= 1 {
            (0..tasks).for_each(f);
            return;
        }
        assert!(tasks < 1 << 32, "{tasks} tasks in one job");
        let _one = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        let f: *const (dyn Fn(usize) + Sync + '_) = f;
        // SAFETY: only the lifetime changes (a raw pointer of the same
        // layout); see the module INVARIANT for when it is dereferenced.
        let f = unsafe { std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), Erased>(f) };
        // 32 bits of epoch: it wraps (after 2^32 jobs) as `state` does.
        let epoch = ((s.state.load(Ordering::Acquire) >> 32) + 1) & 0xFFFF_FFFF;
        let job = Job { epoch, tasks: tasks as u64, f };
        *s.job.lock().unwrap_or_else(|e| e.into_inner()) = Some(job);
        s.finished.store(0, Ordering::Release);
        s.panicked.store(false, Ordering::Release);
        {
            let _g = s.sleep.lock().unwrap_or_else(|e| e.into_inner());
            s.state.store(epoch << 32, Ordering::Release);
            s.wake.notify_all();
        }
        // SAFETY: `f` is this call's own closure.
        let mine = unsafe { s.drain(job) };
        let mut spins = 0u32;
        while s.finished.load(Ordering::Acquire) < tasks {
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(256) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        *s.job.lock().unwrap_or_else(|e| e.into_inner()) = None;
        if let Some(p) = mine {
            std::panic::resume_unwind(p);
        }
        if s.panicked.load(Ordering::Acquire) {
            panic!("a task of the matmul pool panicked on a worker thread");
        }
    }
}

/// A buffer's base pointer, shared by the tasks of [`Pool::chunks_mut`]
/// (each task forms only its own chunks from it).
struct Base<T>(*mut T);

// SAFETY: the tasks of one `chunks_mut` call form disjoint chunks of a
// buffer borrowed mutably for that call; moving or sharing the pointer
// between them moves `&mut` chunks of `T: Send` between threads.
unsafe impl<T: Send> Send for Base<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for Base<T> {}

/// Chunks below which [`Pool::chunks_mut`] stays on the calling thread
/// (a job's dispatch costs about what a few short rows of work do).
const PAR_CHUNKS: usize = 32;

impl Pool {
    /// Runs `f(i, chunk)` for every chunk `i` of `len` elements of `buf`
    /// (a trailing part shorter than `len` is left alone), spread over the
    /// pool when there are many, in order on this thread otherwise.
    pub fn chunks_mut<T: Send>(
        &self,
        buf: &mut [T],
        len: usize,
        f: &(dyn Fn(usize, &mut [T]) + Sync),
    ) {
        assert!(len > 0, "chunks of no elements");
        let n = buf.len() / len;
        if self.threads == 1 || n < PAR_CHUNKS {
            buf.chunks_exact_mut(len).enumerate().for_each(|(i, c)| f(i, c));
            return;
        }
        let per = n.div_ceil(self.threads * 4);
        let base = Base(buf.as_mut_ptr());
        let base = &base;
        self.run(n.div_ceil(per), &|t| {
            for i in t * per..((t + 1) * per).min(n) {
                // SAFETY: chunk i is elements i·len..(i + 1)·len of `buf`
                // (i < n, so within it); task t alone forms chunks
                // t·per..(t + 1)·per, so no element is reached twice; `buf`
                // stays borrowed mutably until `run` has returned, after
                // every task.
                let c = unsafe { std::slice::from_raw_parts_mut(base.0.add(i * len), len) };
                f(i, c);
            }
        });
    }
}

fn worker(s: &Shared) {
    let mut seen = 0u64;
    loop {
        let mut spins = 0u32;
        let epoch = loop {
            if s.stop.load(Ordering::Acquire) {
                return;
            }
            let e = s.state.load(Ordering::Acquire) >> 32;
            if e != seen {
                break e;
            }
            spins += 1;
            if spins < SPIN {
                std::hint::spin_loop();
                continue;
            }
            let g = s.sleep.lock().unwrap_or_else(|e| e.into_inner());
            if s.state.load(Ordering::Acquire) >> 32 == seen && !s.stop.load(Ordering::Acquire) {
                drop(s.wake.wait(g).unwrap_or_else(|e| e.into_inner()));
            }
        };
        seen = epoch;
        let job = *s.job.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(job) = job {
            // A stale job (the caller moved on) fails every claim: its
            // epoch is no longer current, or all its tasks are claimed.
            // A panic is recorded in `panicked` by `drain`; the caller
            // re-raises it.
            // SAFETY: `job` was read from the slot, whole.
            let _ = unsafe { s.drain(job) };
        }
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
    fn chunks_are_each_visited_once_with_their_index() {
        for threads in [1, 2, 3] {
            let pool = Pool::new(threads);
            for n in [0usize, 5, 31, 32, 33, 100, 1000] {
                let mut buf = vec![0usize; n * 3 + 2];
                pool.chunks_mut(&mut buf, 3, &|i, c| c.iter_mut().for_each(|v| *v += i + 1));
                for (j, v) in buf.iter().enumerate() {
                    let want = if j < n * 3 { j / 3 + 1 } else { 0 };
                    assert_eq!(*v, want, "threads {threads}, n {n}, element {j}");
                }
            }
        }
    }

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

    /// A panicking task does not let `run` return while other tasks still
    /// use the borrowed closure: every claimed task finishes first, then the
    /// panic reaches the caller, and the pool goes on working.
    #[test]
    fn a_panic_waits_for_every_task_and_the_pool_survives() {
        let pool = Pool::new(2);
        for round in 0..20 {
            let hits: Vec<AtomicUsize> = (0..64).map(|_| AtomicUsize::new(0)).collect();
            let live = AtomicUsize::new(0);
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                pool.run(64, &|i| {
                    live.fetch_add(1, Ordering::SeqCst);
                    std::thread::sleep(std::time::Duration::from_micros(50));
                    hits[i].fetch_add(1, Ordering::SeqCst);
                    live.fetch_sub(1, Ordering::SeqCst);
                    if i == (round * 7) % 64 {
                        panic!("task {i}");
                    }
                })
            }));
            assert!(r.is_err());
            // Nothing still runs once `run` has unwound.
            assert_eq!(live.load(Ordering::SeqCst), 0);
            assert!(hits.iter().all(|h| h.load(Ordering::SeqCst) == 1));
        }
        let n = AtomicUsize::new(0);
        pool.run(10, &|_| {
            n.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(n.load(Ordering::Relaxed), 10);
    }

    /// A panic on a worker thread (not the caller's) reaches the caller
    /// after every task has finished; a job no worker took part in does not
    /// panic at all.
    #[test]
    fn a_panicking_worker_task_is_raised_by_the_caller() {
        let pool = Pool::new(3);
        for _ in 0..if cfg!(miri) { 3 } else { 20 } {
            let on_worker = AtomicBool::new(false);
            let live = AtomicUsize::new(0);
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                pool.run(32, &|_| {
                    live.fetch_add(1, Ordering::SeqCst);
                    std::thread::sleep(std::time::Duration::from_micros(20));
                    live.fetch_sub(1, Ordering::SeqCst);
                    if std::thread::current().name().is_some_and(|n| n.starts_with("agentd-mm")) {
                        on_worker.store(true, Ordering::SeqCst);
                        panic!("a worker's task");
                    }
                })
            }));
            assert_eq!(r.is_err(), on_worker.load(Ordering::SeqCst));
            assert_eq!(live.load(Ordering::SeqCst), 0);
        }
    }

    /// Jobs of different sizes back to back, each closure borrowing data
    /// exactly its size from the caller's stack: a worker late from one job
    /// never runs a task index of the next one's count on the old closure
    /// (that would index out of bounds here, and is a use after free under
    /// Miri).
    #[test]
    fn a_late_worker_never_runs_a_stale_job() {
        let pool = Pool::new(4);
        let rounds = if cfg!(miri) { 40 } else { 4000 };
        for k in 0..rounds {
            let n = [2usize, 9, 3, 17][k % 4];
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            pool.run(n, &|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
        }
    }
}
