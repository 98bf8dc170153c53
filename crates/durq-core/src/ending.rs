//! Waiting for a job to end (CONTRACT O1, O2): the loop every backend's
//! [`Backend::wait_for_ending`](crate::Backend::wait_for_ending) shares.
//!
//! A backend supplies one step, *arming*: it registers for news of the job's ending
//! (a notice channel, an in-process signal) and only then reads the job, so an ending
//! that commits between the read and the wait still wakes the waiter. The loop here
//! answers the job once a read finds it ended, and otherwise waits for the armed
//! signal, the backend's fallback poll, or the deadline, and arms again.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::future;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::error::Result;
use crate::model::Job;

/// A future a backend resolves when the job it was armed for may have ended.
pub type Woken<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// The boxed future of one arming step.
pub type Arming<'a> = Pin<Box<dyn Future<Output = Result<Armed<'a>>> + Send + 'a>>;

/// What one arming step hands back: the job as read *after* the signal was set up,
/// and the signal.
pub struct Armed<'a> {
    /// The job as stored when it was read.
    pub job: Job,
    /// Resolves when the job may have ended since that read. Spurious wake-ups are
    /// allowed (the loop reads again); a missed ending is not, except where the
    /// backend's fallback poll covers it.
    pub woken: Woken<'a>,
}

impl<'a> Armed<'a> {
    /// The job as read, and the signal set up before the read.
    pub fn new(job: Job, woken: impl Future<Output = ()> + Send + 'a) -> Self {
        Armed {
            job,
            woken: Box::pin(woken),
        }
    }

    /// The job as read, with no signal: the loop looks again only at its poll.
    pub fn unwatched(job: Job) -> Self {
        Armed::new(job, future::pending())
    }
}

impl std::fmt::Debug for Armed<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Armed")
            .field("job", &self.job.id)
            .finish_non_exhaustive()
    }
}

/// How often the default [`Backend::wait_for_ending`](crate::Backend::wait_for_ending),
/// which has no signal, reads the job again.
pub const DEFAULT_ENDING_POLL: Duration = Duration::from_millis(250);

/// Arms, reads and waits until the job has ended (`Some`, as read then) or `timeout`
/// (real time) has passed (`None`, after one last read at the deadline). `poll`, if
/// given, bounds each wait: the fallback for signals a backend can lose.
pub async fn wait_until_ended<'a, A>(
    timeout: Duration,
    poll: Option<Duration>,
    mut arm: A,
) -> Result<Option<Job>>
where
    A: FnMut() -> Arming<'a>,
{
    let start = Instant::now();
    loop {
        let Armed { job, woken } = arm().await?;
        if job.state.is_terminal() {
            return Ok(Some(job));
        }
        let left = timeout.saturating_sub(start.elapsed());
        if left.is_zero() {
            return Ok(None);
        }
        // The signal, bounded by the fallback poll and the deadline; however the wait
        // ends, the next round reads the job again.
        let bound = poll.map_or(left, |poll| poll.min(left));
        let _ = tokio::time::timeout(bound, woken).await;
    }
}

/// The signal of endings of a backend whose jobs end in its own process (the memory
/// store, SQLite's writer): whatever ends jobs calls [`ended`](Self::ended) once it is
/// done (the lock let go, the commit made), which wakes the waits only while one is
/// counted, so endings cost one load while nobody waits.
#[derive(Debug, Default)]
pub struct EndingSignal {
    notify: Notify,
    waits: AtomicUsize,
}

impl EndingSignal {
    /// Counts a wait for as long as the guard lives. Take it before the wait's first
    /// read: an ending then either sees the count or happened before that read.
    pub fn count_wait(&self) -> CountedWait<'_> {
        self.waits.fetch_add(1, Ordering::SeqCst);
        CountedWait(&self.waits)
    }

    /// Resolves at the next [`ended`](Self::ended) after this call (registered now, so
    /// an ending between this call and the read that follows it is not missed).
    pub fn next_ending(&self) -> Woken<'_> {
        let mut notified = Box::pin(self.notify.notified());
        notified.as_mut().enable();
        notified
    }

    /// Jobs ended: wakes the counted waits, if any.
    pub fn ended(&self) {
        if self.waits.load(Ordering::SeqCst) > 0 {
            self.notify.notify_waiters();
        }
    }
}

/// A wait counted by an [`EndingSignal`]; uncounted when dropped.
#[derive(Debug)]
pub struct CountedWait<'a>(&'a AtomicUsize);

impl Drop for CountedWait<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;
    use crate::{JobId, JobState, NewJob, Timestamp};

    fn job(state: JobState) -> Job {
        let now = Timestamp::from_millis(0);
        let (mut job, _payload) = Job::enqueued(NewJob::new("q"), JobId::mint(now), now);
        job.state = state;
        job
    }

    #[tokio::test(start_paused = true)]
    async fn an_ended_job_is_answered_at_the_first_read() {
        let reads = AtomicUsize::new(0);
        let answer = wait_until_ended(Duration::from_secs(60), None, || {
            reads.fetch_add(1, Ordering::SeqCst);
            Box::pin(async { Ok(Armed::unwatched(job(JobState::Succeeded))) })
        })
        .await
        .unwrap_or_else(|err| panic!("{err}"));
        assert_eq!(answer.map(|j| j.state), Some(JobState::Succeeded));
        assert_eq!(reads.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_signal_makes_the_loop_read_again_and_the_deadline_ends_it() {
        // The signal fires at once twice, then never: three reads find the job running,
        // the fourth comes at the deadline (the paused clock jumps there).
        let reads = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&reads);
        let answer = wait_until_ended(Duration::from_secs(60), None, move || {
            let n = counted.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                let running = job(JobState::Running);
                Ok(if n < 2 {
                    Armed::new(running, async {})
                } else {
                    Armed::unwatched(running)
                })
            })
        })
        .await
        .unwrap_or_else(|err| panic!("{err}"));
        assert!(answer.is_none(), "the job never ended");
        assert_eq!(reads.load(Ordering::SeqCst), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn the_poll_bounds_each_wait() {
        let reads = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&reads);
        let answer = wait_until_ended(
            Duration::from_secs(10),
            Some(Duration::from_secs(1)),
            move || {
                let n = counted.fetch_add(1, Ordering::SeqCst);
                Box::pin(async move {
                    let state = if n == 3 {
                        JobState::Dead
                    } else {
                        JobState::Queued
                    };
                    Ok(Armed::unwatched(job(state)))
                })
            },
        )
        .await
        .unwrap_or_else(|err| panic!("{err}"));
        assert_eq!(answer.map(|j| j.state), Some(JobState::Dead));
        assert_eq!(reads.load(Ordering::SeqCst), 4, "one read per poll");
    }
}
