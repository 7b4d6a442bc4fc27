//! Long-lived reader threads, each making one chain of blocking calls at a time, that a
//! caller waits for only until its deadline.
//!
//! NVML calls block for minutes on a GPU that fell off the bus or under a wedged driver,
//! and a read of `/proc/PID/maps` blocks while that process holds its memory map lock in
//! uninterruptible sleep. Neither can be cancelled. So each source that may block (the
//! NVML library, each GPU, the `/proc` reader) has a thread of its own, started once;
//! a look hands it a job and awaits its answer until its deadline (a server's look is a
//! task on its async thread, which serves other requests meanwhile; a one-shot command's
//! waits block its thread through [`block_on`]). A thread still in its job when
//! the deadline passes is reported with the call it is stuck in and since when; that
//! call is "given up on": later looks report it at once and hand the thread nothing,
//! until the call returns. So threads never stack behind a stuck call, however many
//! looks come meanwhile, and a source that answers again is read by the next look.
//!
//! A look that finds the thread busy with a call nobody has given up on (the job a
//! server starts at launch to load NVML, or a job whose stuck call has just returned and
//! that is finishing its other calls) queues its own job behind it, at most one, and
//! waits until its deadline as usual.
//!
//! A job says which call it is in by [`calling`] before each blocking call; the name is
//! what a stuck source is reported with.

use crate::sync::lock;
use std::cell::RefCell;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// How long a caller whose deadline has passed still waits for an answer that may be on
/// its way: a job says it is idle just before it sends its answer.
const ANSWER_IN_FLIGHT: Duration = Duration::from_millis(5);

/// A call that has not returned yet: its name and when it started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct InCall {
    /// The call, as its job named it (an NVML function, a `/proc` look).
    pub(crate) call: &'static str,
    /// When it started.
    pub(crate) since: Instant,
}

/// Why a job gave no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum NoAnswer {
    /// The thread is still in a call: this job's, or an earlier one's that has not
    /// returned (then this job was never handed over).
    Stuck(InCall),
    /// The thread could not be started, or the job panicked.
    Failed(String),
}

/// What a worker is doing, shared by its thread and the callers.
#[derive(Debug, Default)]
struct Status {
    busy: Mutex<Busy>,
}

#[derive(Debug, Default)]
struct Busy {
    /// The call the current job is in; `None` while idle.
    in_call: Option<InCall>,
    /// A job waits behind the current one.
    queued: bool,
    /// The call a caller stopped waiting for: while the job is still in it, it is stuck.
    given_up: Option<InCall>,
}

type Job<S> = Box<dyn FnOnce(&mut S) + Send>;

thread_local! {
    /// The status of the worker this thread is, so that [`calling`] can say where a job is.
    static CURRENT: RefCell<Option<Arc<Status>>> = const { RefCell::new(None) };
}

/// Says that the job running on this thread is about to make `call` (a blocking call
/// that may not return): if it does not, that is what the worker is reported stuck in,
/// and since now. Does nothing outside a worker.
pub(crate) fn calling(call: &'static str) {
    CURRENT.with(|current| {
        if let Some(status) = current.borrow().as_ref() {
            lock(&status.busy).in_call = Some(InCall {
                call,
                since: Instant::now(),
            });
        }
    });
}

/// One long-lived thread owning state `S`, running one job at a time.
#[derive(Debug)]
pub(crate) struct Worker<S> {
    /// `Err` with the reason when the thread could not be started.
    jobs: Result<mpsc::Sender<Job<S>>, String>,
    status: Arc<Status>,
}

impl<S: Send + 'static> Worker<S> {
    /// Starts the thread `name` (at most 15 bytes: Linux's limit) with `state`.
    pub(crate) fn start(name: &str, mut state: S) -> Worker<S> {
        let status = Arc::new(Status::default());
        let (sender, receiver) = mpsc::channel::<Job<S>>();
        let shared = Arc::clone(&status);
        let spawned = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                CURRENT.with(|current| *current.borrow_mut() = Some(Arc::clone(&shared)));
                // Ends when the worker is dropped (its sender with it).
                while let Ok(job) = receiver.recv() {
                    // A panicking job loses its answer (the caller sees `Failed`), not
                    // the thread. A job that returns has said it is idle itself.
                    let ran =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(&mut state)));
                    if ran.is_err() {
                        lock(&shared.busy).in_call = None;
                    }
                }
            });
        let jobs = match spawned {
            Ok(_) => Ok(sender),
            Err(error) => {
                tracing::error!(thread = name, error = %error, "cannot start a reader thread");
                Err(format!("cannot start the thread {name}: {error}"))
            }
        };
        Worker { jobs, status }
    }

    /// Hands `job` to the thread, unless it is stuck in an earlier job that a caller
    /// gave up on (or one waits behind such a job already): then that job's call is the
    /// answer, and `job` is dropped. `first_call` names what the job does until it says
    /// otherwise with [`calling`].
    pub(crate) fn submit<T: Send + 'static>(
        &self,
        first_call: &'static str,
        job: impl FnOnce(&mut S) -> T + Send + 'static,
    ) -> Result<Pending<T>, NoAnswer> {
        self.hand(first_call, job, false)
    }

    /// Hands `job` to the thread only if it is idle now, so that it starts at once and
    /// nothing else is queued behind it; `None` (and `job` dropped) otherwise. For work
    /// started ahead of need: whoever needs it then hands it over with
    /// [`Worker::submit`], which queues or reports the thread stuck as usual.
    pub(crate) fn submit_if_idle<T: Send + 'static>(
        &self,
        first_call: &'static str,
        job: impl FnOnce(&mut S) -> T + Send + 'static,
    ) -> Option<Pending<T>> {
        self.hand(first_call, job, true).ok()
    }

    /// Like [`Worker::submit_if_idle`], for a job that answers twice: what it sends
    /// through the [`Early`] it is given, as soon as it has it (what the caller needs
    /// first), and then what it returns (work the caller may still want after that).
    /// Each answer is waited for on its own; a caller that gives up on the first one
    /// gives the thread up as usual, and one that drops the second lets the thread
    /// finish it for nobody.
    pub(crate) fn submit_two_if_idle<A: Send + 'static, T: Send + 'static>(
        &self,
        first_call: &'static str,
        job: impl FnOnce(&mut S, Early<A>) -> T + Send + 'static,
    ) -> Option<(Pending<A>, Pending<T>)> {
        let (early, first) = oneshot::channel();
        let then = self
            .hand(
                first_call,
                move |state: &mut S| job(state, Early(early)),
                true,
            )
            .ok()?;
        let first = Pending {
            reply: first,
            status: Arc::clone(&then.status),
            first_call,
            handed_at: then.handed_at,
        };
        Some((first, then))
    }

    fn hand<T: Send + 'static>(
        &self,
        first_call: &'static str,
        job: impl FnOnce(&mut S) -> T + Send + 'static,
        only_if_idle: bool,
    ) -> Result<Pending<T>, NoAnswer> {
        let jobs = self
            .jobs
            .as_ref()
            .map_err(|why| NoAnswer::Failed(why.clone()))?;
        {
            let mut busy = lock(&self.status.busy);
            match busy.in_call {
                Some(in_call) if only_if_idle || busy.given_up == Some(in_call) || busy.queued => {
                    return Err(NoAnswer::Stuck(in_call))
                }
                Some(_) => busy.queued = true,
                None => {
                    busy.in_call = Some(InCall {
                        call: first_call,
                        since: Instant::now(),
                    })
                }
            }
        }
        let (answer, reply) = oneshot::channel();
        let status = Arc::clone(&self.status);
        let handed = jobs.send(Box::new(move |state: &mut S| {
            *lock(&status.busy) = Busy {
                in_call: Some(InCall {
                    call: first_call,
                    since: Instant::now(),
                }),
                queued: false,
                given_up: None,
            };
            let answered = job(state);
            // Idle before the answer goes out: whoever acts on the answer may hand the
            // next job at once.
            lock(&status.busy).in_call = None;
            // The caller may have stopped waiting: then nobody takes the answer.
            let _ = answer.send(answered);
        }));
        if handed.is_err() {
            *lock(&self.status.busy) = Busy::default();
            return Err(NoAnswer::Failed("the reader thread has ended".into()));
        }
        Ok(Pending {
            reply,
            status: Arc::clone(&self.status),
            first_call,
            handed_at: Instant::now(),
        })
    }

    /// Runs `job` as [`Worker::submit`] does and waits for its answer until `deadline`.
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        first_call: &'static str,
        deadline: Instant,
        job: impl FnOnce(&mut S) -> T + Send + 'static,
    ) -> Result<T, NoAnswer> {
        answer(self.submit(first_call, job), deadline).await
    }

    /// The call the thread is in, while it is in one.
    pub(crate) fn in_call(&self) -> Option<InCall> {
        lock(&self.status.busy).in_call
    }
}

/// Where a job of [`Worker::submit_two_if_idle`] sends its first answer.
pub(crate) struct Early<A>(oneshot::Sender<A>);

impl<A> Early<A> {
    /// Sends the first answer; nobody may be waiting for it any more.
    pub(crate) fn answer(self, answer: A) {
        let _ = self.0.send(answer);
    }
}

/// A job handed to a worker, whose answer may still come: waited for by a task, so that
/// the thread waiting (the server's async thread) is woken once, by the answer.
#[derive(Debug)]
pub(crate) struct Pending<T> {
    reply: oneshot::Receiver<T>,
    status: Arc<Status>,
    /// What the job does before it says otherwise, and when it was handed over: what
    /// is reported while it has not started (queued behind another).
    first_call: &'static str,
    handed_at: Instant,
}

impl<T> Pending<T> {
    /// The job's answer, or the call it is still in at `deadline`.
    pub(crate) async fn wait_until(mut self, deadline: Instant) -> Result<T, NoAnswer> {
        let panicked = || NoAnswer::Failed("the reading panicked".into());
        match tokio::time::timeout_at(deadline.into(), &mut self.reply).await {
            Ok(Ok(answer)) => return Ok(answer),
            Ok(Err(_)) => return Err(panicked()),
            Err(_) => {}
        }
        match tokio::time::timeout(ANSWER_IN_FLIGHT, &mut self.reply).await {
            Ok(Ok(answer)) => return Ok(answer),
            Ok(Err(_)) => return Err(panicked()),
            Err(_) => {}
        }
        let mut busy = lock(&self.status.busy);
        match busy.in_call {
            Some(in_call) => {
                // Given up on: later looks report it at once, and hand it nothing while
                // it is in this call.
                busy.given_up = Some(in_call);
                Err(NoAnswer::Stuck(in_call))
            }
            // Between the job it was queued behind and its own start.
            None => Err(NoAnswer::Stuck(InCall {
                call: self.first_call,
                since: self.handed_at,
            })),
        }
    }
}

/// The answer of a job `handed` over, awaited until `deadline`, or why it was not handed
/// over (its thread is stuck in a call given up on).
pub(crate) async fn answer<T>(
    handed: Result<Pending<T>, NoAnswer>,
    deadline: Instant,
) -> Result<T, NoAnswer> {
    match handed {
        Ok(pending) => pending.wait_until(deadline).await,
        Err(no_answer) => Err(no_answer),
    }
}

/// Runs `look` to its end on this thread, for a caller that is not a task (a one-shot
/// command, a test): its waits then block this thread, as they should there.
pub(crate) fn block_on<T>(look: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime for one look")
        .block_on(look)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A job that blocks until its gate is opened (a message sent, or the sender
    /// dropped), saying which call it is in; it counts the jobs run.
    fn gated() -> (
        mpsc::Sender<()>,
        impl FnOnce(&mut u32) -> u32 + Send + 'static,
    ) {
        let (open, gate) = mpsc::channel::<()>();
        let job = move |count: &mut u32| {
            calling("blockingCall");
            let _ = gate.recv();
            *count += 1;
            *count
        };
        (open, job)
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(10)
    }

    /// The count a job reads once the worker takes jobs again (its stuck call returned).
    fn count_once_free(worker: &Worker<u32>) -> u32 {
        let deadline = soon();
        loop {
            match block_on(worker.run("after", deadline, |count| *count)) {
                Ok(count) => return count,
                Err(NoAnswer::Stuck(_)) if Instant::now() < deadline => std::thread::yield_now(),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn a_job_answers_and_the_state_stays_with_the_thread() {
        let worker = Worker::start("test-worker", 0u32);
        assert_eq!(
            block_on(worker.run("first", soon(), |count| *count += 5)),
            Ok(())
        );
        assert_eq!(
            block_on(worker.run("second", soon(), |count| *count)),
            Ok(5)
        );
        assert_eq!(worker.in_call(), None);
    }

    #[test]
    fn a_stuck_job_is_reported_with_its_call_and_no_job_is_stacked_behind_it() {
        let worker = Worker::start("test-stuck", 0u32);
        let (open, job) = gated();
        let started = Instant::now();
        let answer =
            block_on(worker.run("opening", Instant::now() + Duration::from_millis(50), job));
        let Err(NoAnswer::Stuck(in_call)) = answer else {
            panic!("{answer:?}")
        };
        assert_eq!(in_call.call, "blockingCall");
        assert!(in_call.since >= started);
        // Given up on: later jobs are not handed over; they are told where it is, at once.
        let ran = Arc::new(Mutex::new(false));
        let flag = Arc::clone(&ran);
        let refused = worker.submit("never", move |_| *lock(&flag) = true);
        assert_eq!(refused.map(drop), Err(NoAnswer::Stuck(in_call)));
        assert_eq!(worker.in_call(), Some(in_call));
        // Once the call returns, the next job runs; the refused one never did.
        open.send(()).unwrap();
        assert_eq!(count_once_free(&worker), 1);
        assert!(!*lock(&ran));
    }

    #[test]
    fn a_job_nobody_gave_up_on_is_waited_for_with_one_more_queued_behind_it() {
        let worker = Worker::start("test-queue", 0u32);
        let (open, job) = gated();
        // Started without anyone waiting for it (a server loading NVML at launch).
        drop(worker.submit("loading", job).unwrap());
        // A look that comes meanwhile queues behind it rather than calling it stuck...
        let queued = worker.submit("look", |count: &mut u32| *count).unwrap();
        // ...and only one may: a third is told where the thread is.
        let third = worker.submit("third", |count: &mut u32| *count);
        assert!(matches!(third, Err(NoAnswer::Stuck(_))), "{third:?}");
        drop(open);
        assert_eq!(block_on(queued.wait_until(soon())), Ok(1));
    }

    #[test]
    fn a_stuck_job_that_moves_on_to_its_next_call_is_waited_for_again() {
        let worker = Worker::start("test-moves-on", 0u32);
        let (first, second) = (mpsc::channel::<()>(), mpsc::channel::<()>());
        let (open_first, open_second) = (first.0, second.0);
        let (gate_first, gate_second) = (first.1, second.1);
        let (moved_on, told) = mpsc::channel::<()>();
        let job = move |count: &mut u32| {
            calling("hangingCall");
            let _ = gate_first.recv();
            calling("nextCall");
            let _ = moved_on.send(());
            let _ = gate_second.recv();
            *count += 1;
            *count
        };
        let stuck = block_on(worker.run("start", Instant::now() + Duration::from_millis(50), job));
        assert!(matches!(
            stuck,
            Err(NoAnswer::Stuck(InCall {
                call: "hangingCall",
                ..
            }))
        ));
        // The hang ends; the job goes on with its next call. A look now waits for it
        // (queued behind it) instead of calling the thread stuck.
        open_first.send(()).unwrap();
        told.recv().unwrap();
        let queued = worker.submit("look", |count: &mut u32| *count).unwrap();
        drop(open_second);
        assert_eq!(block_on(queued.wait_until(soon())), Ok(1));
    }

    #[test]
    fn a_panicking_job_fails_alone_and_the_thread_goes_on() {
        let worker = Worker::start("test-panic", 0u32);
        let failed = block_on(worker.run("boom", soon(), |_| -> u32 { panic!("a bug in a job") }));
        assert!(matches!(failed, Err(NoAnswer::Failed(_))), "{failed:?}");
        let deadline = soon();
        while worker.in_call().is_some() {
            assert!(Instant::now() < deadline);
            std::thread::yield_now();
        }
        assert_eq!(
            block_on(worker.run("after", soon(), |count| *count + 1)),
            Ok(1)
        );
    }

    #[test]
    fn a_job_ahead_of_need_is_handed_only_to_an_idle_thread() {
        let worker = Worker::start("test-if-idle", 0u32);
        let ahead = worker.submit_if_idle("ahead", |count: &mut u32| *count + 1);
        assert_eq!(
            ahead.map(|pending| block_on(pending.wait_until(soon()))),
            Some(Ok(1))
        );
        let (open, job) = gated();
        let busy = worker.submit("busy", job).unwrap();
        // Busy: the job is not handed over, and does not take the one place in the queue.
        assert!(worker
            .submit_if_idle("ahead", |count: &mut u32| *count)
            .is_none());
        let queued = worker.submit("look", |count: &mut u32| *count).unwrap();
        drop(open);
        assert_eq!(block_on(busy.wait_until(soon())), Ok(1));
        assert_eq!(block_on(queued.wait_until(soon())), Ok(1));
    }

    #[test]
    fn a_job_that_answers_twice_is_waited_for_answer_by_answer() {
        let worker = Worker::start("test-two", 0u32);
        let (open, gate) = mpsc::channel::<()>();
        let (first, then) = worker
            .submit_two_if_idle("first part", move |count: &mut u32, early| {
                *count += 1;
                early.answer(*count);
                calling("second part");
                let _ = gate.recv();
                *count + 10
            })
            .unwrap();
        // The first answer comes while the second part has not ended.
        assert_eq!(block_on(first.wait_until(soon())), Ok(1));
        // The second part is still running: no other job ahead of need is taken.
        assert!(worker
            .submit_two_if_idle("again", |_: &mut u32, _: Early<u32>| 0)
            .is_none());
        let stuck = block_on(then.wait_until(Instant::now() + Duration::from_millis(20)));
        assert!(
            matches!(
                stuck,
                Err(NoAnswer::Stuck(InCall {
                    call: "second part",
                    ..
                }))
            ),
            "{stuck:?}"
        );
        drop(open);
        assert_eq!(count_once_free(&worker), 1);
    }

    #[test]
    fn a_first_answer_never_sent_is_a_failure_not_a_hang() {
        let worker = Worker::start("test-two-none", 0u32);
        let (first, then) = worker
            .submit_two_if_idle("first part", |_: &mut u32, early: Early<u32>| {
                drop(early);
                7
            })
            .unwrap();
        assert!(matches!(
            block_on(first.wait_until(soon())),
            Err(NoAnswer::Failed(_))
        ));
        assert_eq!(block_on(then.wait_until(soon())), Ok(7));
    }

    #[test]
    fn calling_outside_a_worker_does_nothing() {
        calling("nvmlDeviceGetCount_v2");
    }
}
