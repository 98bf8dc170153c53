//! The queues over the last minutes: a ring of samples of `Store::queues` (each
//! queue's succeeded count, ready count and lag), from which the charts draw throughput
//! and lag.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use durq::QueueOverview;

/// One queue in one sample.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct QueuePoint {
    pub queue: String,
    /// Jobs succeeded so far (as counted by the store; purges lower it).
    pub succeeded: u64,
    /// Jobs ready to run.
    pub ready: u64,
    /// Seconds the oldest ready job has waited; 0 when none is ready.
    pub lag: f64,
}

/// The queues at one instant, sorted by name.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Sample {
    pub at: Instant,
    pub queues: Vec<QueuePoint>,
}

impl Sample {
    pub fn of(at: Instant, queues: &[QueueOverview]) -> Sample {
        Sample {
            at,
            queues: queues
                .iter()
                .map(|q| QueuePoint {
                    queue: q.queue.clone(),
                    succeeded: q.stats.succeeded,
                    ready: q.stats.ready,
                    lag: q.lag.map_or(0.0, |lag| lag.as_secs_f64()),
                })
                .collect(),
        }
    }

    fn get(&self, queue: &str) -> Option<&QueuePoint> {
        self.queues
            .binary_search_by(|p| p.queue.as_str().cmp(queue))
            .ok()
            .and_then(|i| self.queues.get(i))
    }
}

/// A line of a chart: `(seconds before now, value)`, oldest first.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

impl Series {
    /// The largest value of the line.
    pub fn peak(&self) -> f64 {
        self.points.iter().map(|&(_, v)| v).fold(0.0, f64::max)
    }
}

/// The samples of the last `window`, one every `interval`.
#[derive(Debug)]
pub(crate) struct History {
    pub interval: Duration,
    pub window: Duration,
    samples: Mutex<VecDeque<Sample>>,
}

impl History {
    pub fn new(interval: Duration, window: Duration) -> Self {
        History {
            interval,
            window,
            samples: Mutex::new(VecDeque::new()),
        }
    }

    /// Adds `sample`, dropping those older than the window.
    pub fn record(&self, sample: Sample) {
        let mut samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        let keep_after = sample.at.checked_sub(self.window);
        samples.push_back(sample);
        if let Some(cutoff) = keep_after {
            while samples.front().is_some_and(|s| s.at < cutoff) {
                samples.pop_front();
            }
        }
    }

    /// A copy of the samples, oldest first.
    pub fn samples(&self) -> Vec<Sample> {
        let samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        samples.iter().cloned().collect()
    }
}

/// Jobs succeeded per second of each queue (or of `only`), between one sample and the
/// next, at the later one's time. A count that went down (a purge) shows as 0.
pub(crate) fn throughput(samples: &[Sample], now: Instant, only: Option<&str>) -> Vec<Series> {
    per_queue(samples, only, |queue| {
        samples
            .windows(2)
            .filter_map(|pair| {
                let (a, b) = (pair.first()?, pair.get(1)?);
                let (pa, pb) = (a.get(queue)?, b.get(queue)?);
                let secs = b.at.saturating_duration_since(a.at).as_secs_f64();
                if secs <= 0.0 {
                    return None;
                }
                let done = pb.succeeded.saturating_sub(pa.succeeded) as f64;
                Some((before(now, b.at), done / secs))
            })
            .collect()
    })
}

/// The lag of each queue (or of `only`) at each sample.
pub(crate) fn lag(samples: &[Sample], now: Instant, only: Option<&str>) -> Vec<Series> {
    per_queue(samples, only, |queue| {
        samples
            .iter()
            .filter_map(|s| Some((before(now, s.at), s.get(queue)?.lag)))
            .collect()
    })
}

/// Jobs of `queue` succeeded per second over the last `span` of samples, if two
/// samples cover part of it.
pub(crate) fn recent_rate(samples: &[Sample], queue: &str, span: Duration) -> Option<f64> {
    let last = samples.iter().rev().find(|s| s.get(queue).is_some())?;
    let since = last.at.checked_sub(span);
    let first = samples
        .iter()
        .find(|s| since.is_none_or(|since| s.at >= since) && s.get(queue).is_some())?;
    let secs = last.at.saturating_duration_since(first.at).as_secs_f64();
    if secs <= 0.0 {
        return None;
    }
    let done = last
        .get(queue)?
        .succeeded
        .saturating_sub(first.get(queue)?.succeeded);
    Some(done as f64 / secs)
}

/// The queues named in any sample (or just `only`), each with its line.
fn per_queue(
    samples: &[Sample],
    only: Option<&str>,
    line: impl Fn(&str) -> Vec<(f64, f64)>,
) -> Vec<Series> {
    let mut names: Vec<&str> = samples
        .iter()
        .flat_map(|s| s.queues.iter().map(|p| p.queue.as_str()))
        .filter(|name| only.is_none_or(|only| only == *name))
        .collect();
    names.sort_unstable();
    names.dedup();
    names
        .into_iter()
        .map(|name| Series {
            name: name.to_owned(),
            points: line(name),
        })
        .filter(|series| !series.points.is_empty())
        .collect()
}

fn before(now: Instant, at: Instant) -> f64 {
    -now.saturating_duration_since(at).as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(queue: &str, succeeded: u64, lag: f64) -> QueuePoint {
        QueuePoint {
            queue: queue.to_owned(),
            succeeded,
            ready: 0,
            lag,
        }
    }

    #[test]
    fn throughput_is_the_succeeded_count_over_time_and_lag_is_as_sampled() {
        let t0 = Instant::now();
        let at = |secs: u64| t0 + Duration::from_secs(secs);
        let history = History::new(Duration::from_secs(5), Duration::from_secs(60));
        history.record(Sample {
            at: at(0),
            queues: vec![point("a", 0, 1.0), point("b", 10, 0.0)],
        });
        history.record(Sample {
            at: at(5),
            queues: vec![point("a", 50, 2.0), point("b", 5, 0.0)],
        });
        history.record(Sample {
            at: at(10),
            queues: vec![point("a", 60, 0.5)],
        });
        let samples = history.samples();
        let now = at(10);
        let rates = throughput(&samples, now, None);
        assert_eq!(rates.len(), 2);
        assert_eq!(rates[0].name, "a");
        assert_eq!(rates[0].points, vec![(-5.0, 10.0), (0.0, 2.0)]);
        assert_eq!(rates[0].peak(), 10.0);
        // b's count went down (a purge): 0, not negative; then b left the samples.
        assert_eq!(rates[1].points, vec![(-5.0, 0.0)]);
        let lags = lag(&samples, now, Some("a"));
        assert_eq!(lags.len(), 1);
        assert_eq!(lags[0].points, vec![(-10.0, 1.0), (-5.0, 2.0), (0.0, 0.5)]);
        assert_eq!(
            recent_rate(&samples, "a", Duration::from_secs(5)),
            Some(2.0)
        );
        assert_eq!(
            recent_rate(&samples, "a", Duration::from_secs(60)),
            Some(6.0)
        );
        assert_eq!(recent_rate(&samples, "c", Duration::from_secs(60)), None);
    }

    #[test]
    fn samples_older_than_the_window_are_dropped() {
        let t0 = Instant::now();
        let history = History::new(Duration::from_secs(5), Duration::from_secs(15));
        for i in 0..10 {
            history.record(Sample {
                at: t0 + Duration::from_secs(5 * i),
                queues: vec![point("a", i, 0.0)],
            });
        }
        let samples = history.samples();
        assert_eq!(samples.len(), 4, "45 s back to 30 s: 30, 35, 40, 45");
        assert_eq!(samples[0].queues[0].succeeded, 6);
    }
}
