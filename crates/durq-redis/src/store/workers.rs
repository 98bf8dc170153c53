//! Live workers (CONTRACT W1–W4): one `workers.lua` call per write and for the read, so
//! every operation sees and leaves a worker's three entries (spec, jobs in flight, last
//! seen) together.

use durq_core::{Error, Result, StoredWorker, Timestamp};
use redis::Value;

use super::RedisBackend;
use crate::codec::{array, int, text};
use crate::scripts;

/// Seen entries one `reap` call of `workers.lua` looks at; `reap_workers` calls again
/// while a call used its whole bound, so no call's work grows with the number of workers.
const REAP_CHUNK: usize = 1000;

/// The widest millisecond count a zset score (a double) holds exactly.
const EXACT_SCORE: f64 = 9_007_199_254_740_992.0;

impl RedisBackend {
    /// One `workers.lua` call on the namespace's three worker keys.
    async fn workers_script(&self, args: &[&str], what: &str) -> Result<Value> {
        let keys = self.keys();
        let mut invocation = scripts::WORKERS.prepare_invoke();
        invocation
            .key(&keys.workers)
            .key(&keys.workers_busy)
            .key(&keys.workers_seen);
        for arg in args {
            invocation.arg(*arg);
        }
        self.invoke(&invocation, what).await
    }

    /// Rule W1: stores worker `id` whole (spec, in flight, last seen `now`).
    pub(crate) async fn write_worker(
        &self,
        id: &str,
        spec: &str,
        in_flight: u32,
        now: Timestamp,
    ) -> Result<()> {
        let (now, in_flight) = (now.as_millis().to_string(), in_flight.to_string());
        let reply = self
            .workers_script(&["put", id, spec, &now, &in_flight], "put_worker")
            .await?;
        int(&reply, "put_worker reply").map(drop)
    }

    /// Rule W2: sets a known worker's in flight and last seen; false when unknown.
    pub(crate) async fn touch_stored_worker(
        &self,
        id: &str,
        in_flight: u32,
        now: Timestamp,
    ) -> Result<bool> {
        let in_flight = in_flight.to_string();
        let now = now.as_millis().to_string();
        let reply = self
            .workers_script(&["touch", id, &in_flight, &now], "touch_worker")
            .await?;
        Ok(int(&reply, "touch_worker reply")? == 1)
    }

    /// Rule W3: removes worker `id`'s entries; whether its record existed.
    pub(crate) async fn remove_worker(&self, id: &str) -> Result<bool> {
        let reply = self
            .workers_script(&["delete", id], "delete_worker")
            .await?;
        Ok(int(&reply, "delete_worker reply")? == 1)
    }

    /// Rule W1: every worker of the namespace, sorted by id, read in one script call (so
    /// a concurrent write is seen whole or not at all). A record whose in-flight count or
    /// last-seen score is missing or unreadable is `Error::Corrupt`.
    pub(crate) async fn read_workers(&self) -> Result<Vec<StoredWorker>> {
        const WHAT: &str = "workers reply";
        let reply = self.workers_script(&["read"], "workers").await?;
        let items = array(&reply, WHAT)?;
        if items.len() % 4 != 0 {
            return Err(Error::corrupt(WHAT, "not four values per worker"));
        }
        let mut workers = Vec::with_capacity(items.len() / 4);
        for record in items.chunks_exact(4) {
            let [id, spec, busy, seen] = record else {
                return Err(Error::corrupt(WHAT, "not four values per worker"));
            };
            let id = text(id, WHAT)?;
            let what = format!("worker {id}");
            let spec = text(spec, &what)?;
            if matches!(busy, Value::Nil) {
                return Err(Error::corrupt(what, "no in-flight count"));
            }
            let count = text(busy, &what)?;
            let in_flight = count
                .parse::<u32>()
                .map_err(|_| Error::corrupt(what.as_str(), format!("in-flight count {count:?}")))?;
            if matches!(seen, Value::Nil) {
                return Err(Error::corrupt(what, "no last-seen entry"));
            }
            let last_seen = parse_score(&text(seen, &what)?)
                .ok_or_else(|| Error::corrupt(what.as_str(), "last-seen score not a whole ms"))?;
            workers.push(StoredWorker {
                id,
                spec,
                in_flight,
                last_seen,
            });
        }
        workers.sort_unstable_by(|a, b| a.id.cmp(&b.id));
        Ok(workers)
    }

    /// Rule W4: removes every worker last seen strictly before `cutoff`, a bounded
    /// script call at a time, and returns their ids, sorted. Each call is atomic; a
    /// worker that reports between two calls and is no longer silent stays.
    pub(crate) async fn reap_silent_workers(&self, cutoff: Timestamp) -> Result<Vec<String>> {
        const WHAT: &str = "reap_workers reply";
        let cutoff = cutoff.as_millis().to_string();
        let limit = REAP_CHUNK.to_string();
        let mut reaped = Vec::new();
        loop {
            let reply = self
                .workers_script(&["reap", &cutoff, &limit], "reap_workers")
                .await?;
            let items = array(&reply, WHAT)?;
            let [examined, ids] = items else {
                return Err(Error::corrupt(WHAT, "expected a count and ids"));
            };
            let examined = int(examined, WHAT)?;
            for id in array(ids, WHAT)? {
                reaped.push(text(id, WHAT)?);
            }
            // Every entry a call examined is removed, so the next call sees new ones.
            if usize::try_from(examined).map_or(true, |n| n < REAP_CHUNK) {
                break;
            }
        }
        reaped.sort_unstable();
        reaped.dedup();
        Ok(reaped)
    }
}

/// A zset score as whole milliseconds: Redis replies an integral score as an integer,
/// and older servers may write it in exponent form, which is taken when it is exact.
fn parse_score(text: &str) -> Option<Timestamp> {
    if let Ok(ms) = text.parse::<i64>() {
        return Some(Timestamp::from_millis(ms));
    }
    let score = text.parse::<f64>().ok()?;
    if score.is_finite() && score.fract() == 0.0 && score.abs() <= EXACT_SCORE {
        // Exact: an integral double within ±2^53 converts to i64 without loss.
        #[allow(clippy::cast_possible_truncation)]
        return Some(Timestamp::from_millis(score as i64));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scores_read_as_whole_milliseconds() {
        assert_eq!(
            parse_score("1700000000000"),
            Some(Timestamp::from_millis(1_700_000_000_000))
        );
        assert_eq!(
            parse_score("1.7e+12"),
            Some(Timestamp::from_millis(1_700_000_000_000))
        );
        assert_eq!(parse_score("-5"), Some(Timestamp::from_millis(-5)));
        assert_eq!(parse_score("1.5"), None);
        assert_eq!(parse_score("inf"), None);
        assert_eq!(parse_score("nan"), None);
        assert_eq!(parse_score("x"), None);
    }
}
