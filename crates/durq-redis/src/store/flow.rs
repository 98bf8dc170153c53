//! Flow control (CONTRACT K1–K5): a queue's limits stored in the `limits` hash, the
//! claim of queues with limits over `claim_limited.lua`, `flow_status`, and when a rate
//! frees a start for `wait_for_work`. `lua/flow.lua` describes the keys.
//!
//! A plain claim (`claim.lua`) answers `limited`, before it writes anything, when one
//! of its queues has limits; the store then remembers those queues (per handle, in
//! [`LimitedQueues`]) and its claim loop (`store/claim.rs`) calls `claim_limited.lua`
//! for them from then on, with the same slices of the predicted head. A queue that
//! loses its limits is forgotten once a limited claim reports none of its queues has
//! any. So a store whose queues have no limits pays one `EXISTS` per claim call.

use std::collections::HashSet;
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use durq_core::{
    Error, FlowStatus, QueueLimits, Rate, Result, StoredLimits, Timestamp, FLOW_KEYS_SHOWN,
};

use super::RedisBackend;
use crate::codec::{concurrency_key_of, text};
use crate::conn::map_err;
use crate::scripts::{self, Eval};

/// A concurrency key as an index entry or a field name holds it (hex), read back.
fn unhex_key(hex: &str, what: &str) -> Result<String> {
    match concurrency_key_of(Some(hex.as_bytes())) {
        Ok(Some(key)) => Ok(key),
        Ok(None) | Err(_) => Err(Error::corrupt(what, format!("concurrency key {hex:?}"))),
    }
}

/// One page of `HSCAN`: the next cursor and the (field, value) pairs.
type ScanPage = (u64, Vec<(Vec<u8>, Vec<u8>)>);

/// The digits of one start in a start log (`lua/flow.lua`'s `LOG_WIDTH`).
const LOG_WIDTH: usize = 15;

/// The queues this handle found limits on, so its claims of them go straight to
/// `claim_limited.lua`. Only a shortcut: `claim.lua` refuses a queue with limits
/// whatever this holds.
#[derive(Debug, Default)]
pub(crate) struct LimitedQueues {
    queues: RwLock<HashSet<String>>,
}

impl LimitedQueues {
    fn any(&self, queues: &[String]) -> bool {
        let known = self.queues.read().unwrap_or_else(|p| p.into_inner());
        !known.is_empty() && queues.iter().any(|queue| known.contains(queue))
    }

    fn remember(&self, queues: &[String]) {
        let mut known = self.queues.write().unwrap_or_else(|p| p.into_inner());
        known.extend(queues.iter().cloned());
    }

    fn forget(&self, queues: &[String]) {
        let mut known = self.queues.write().unwrap_or_else(|p| p.into_inner());
        for queue in queues {
            known.remove(queue);
        }
    }
}

/// How often, in real time, one handle's reclaim sweeps the start logs (one pass of
/// [`SWEEP_PAGES`] pages at most): logs of idle keys are small, so this only bounds
/// their number, not a window's correctness.
const SWEEP_EVERY: Duration = Duration::from_secs(10);
/// `HSCAN` pages of `flow` one sweep reads at most, and fields per page.
const SWEEP_PAGES: usize = 16;
const SWEEP_PAGE: usize = 256;

/// Where this handle's sweep of the start logs stands: when it last ran, and the
/// `HSCAN` cursor it goes on from.
#[derive(Debug, Default)]
pub(crate) struct StartSweep {
    state: Mutex<(Option<Instant>, String)>,
}

/// A queue's limits as the `limits` hash holds them: `MR MRK MS MS_MS MSK MSK_MS FAIR`,
/// `-` for none (`lua/flow.lua`'s `parse_limits` reads it).
fn limits_text(limits: QueueLimits) -> String {
    let stored = StoredLimits::from(limits);
    let word = |value: Option<i64>| value.map_or_else(|| "-".to_owned(), |n| n.to_string());
    format!(
        "{} {} {} {} {} {} {}",
        word(stored.max_running),
        word(stored.max_running_per_key),
        word(stored.max_starts),
        word(stored.max_starts_ms),
        word(stored.max_starts_per_key),
        word(stored.max_starts_per_key_ms),
        if stored.fair_shares { 1 } else { 0 }
    )
}

/// The limits of `queue` from their text, checked as every backend checks its row.
fn parse_limits(queue: &str, text: &str) -> Result<QueueLimits> {
    let corrupt = || Error::corrupt(format!("limits of queue {queue}"), text.to_owned());
    let words: Vec<&str> = text.split(' ').collect();
    let [ref counts @ .., fair] = words[..] else {
        return Err(corrupt());
    };
    if counts.len() != 6 {
        return Err(corrupt());
    }
    let fair_shares = match fair {
        "1" => true,
        "0" => false,
        _ => return Err(corrupt()),
    };
    StoredLimits::from_columns(
        |index| match counts[index] {
            "-" => Ok(None),
            word => word.parse().map(Some).map_err(|_| corrupt()),
        },
        fair_shares,
    )?
    .into_limits(queue)
}

/// The starts of a start log, oldest first, in milliseconds.
fn log_starts(log: &[u8], what: &str) -> Result<Vec<i64>> {
    if log.len() % LOG_WIDTH != 0 {
        return Err(Error::corrupt(what, "start log of a wrong length"));
    }
    log.chunks(LOG_WIDTH)
        .map(|chunk| {
            std::str::from_utf8(chunk)
                .ok()
                .and_then(|digits| digits.parse().ok())
                .ok_or_else(|| Error::corrupt(what, "start log entry not a number"))
        })
        .collect()
}

/// When `rate` admits a start again if the starts of `log` fill its window at `now`
/// (K4): the instant its `starts`-th newest start leaves the window. `None` when it
/// admits one now.
fn window_frees_at(log: &[i64], rate: Rate, now: Timestamp) -> Option<Timestamp> {
    let opens_after = rate.window_opens_after(now).as_millis();
    let in_window = log.iter().filter(|at| **at > opens_after).count();
    if rate.admits(in_window as u64) {
        return None;
    }
    let blocking = log[log.len() - rate.starts as usize];
    Some(rate.frees_at(Timestamp::from_millis(blocking)))
}

impl RedisBackend {
    /// Whether a claim of `queues` goes to [`Self::claim_limited`] at once: this handle
    /// found limits on one of them before.
    pub(crate) fn names_limited_queue(&self, queues: &[String]) -> bool {
        self.inner.limited.any(queues)
    }

    /// Notes that `claim.lua` found limits on one of `queues`.
    pub(crate) fn found_limits(&self, queues: &[String]) {
        self.inner.limited.remember(queues);
    }

    /// Notes that a claim found no limits on any of `queues` any more.
    pub(crate) fn forget_limits(&self, queues: &[String]) {
        self.inner.limited.forget(queues);
    }

    /// Deletes the start logs that no window counts any more (`forget_starts.lua`): a
    /// claim trims only the logs it adds to, so a key that stopped starting jobs would
    /// keep its log. Run with reclaim's housekeeping, at most every [`SWEEP_EVERY`] per
    /// handle, a few pages of `flow` at a time; a namespace without `flow` costs one
    /// `EXISTS`.
    pub(crate) async fn sweep_start_logs(&self, now: Timestamp) -> Result<()> {
        let mut cursor = {
            let mut state = self
                .inner
                .start_sweep
                .state
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if state.0.is_some_and(|at| at.elapsed() < SWEEP_EVERY) {
                return Ok(());
            }
            state.0 = Some(Instant::now());
            std::mem::take(&mut state.1)
        };
        for _ in 0..SWEEP_PAGES {
            let from = if cursor.is_empty() { "0" } else { &cursor };
            cursor = self.forget_starts_step(now.as_millis(), from, "").await?;
            if cursor == "0" {
                cursor.clear();
                break;
            }
        }
        let mut state = self
            .inner
            .start_sweep
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        state.1 = cursor;
        Ok(())
    }

    /// Rule K3: stores `limits` as `queue`'s; unlimited limits remove the queue's.
    pub(crate) async fn put_limits(&self, queue: &str, limits: QueueLimits) -> Result<()> {
        let keys = self.keys();
        let cmd = if limits.is_unlimited() {
            let mut cmd = redis::cmd("HDEL");
            cmd.arg(&keys.limits).arg(queue);
            cmd
        } else {
            let mut cmd = redis::cmd("HSET");
            cmd.arg(&keys.limits).arg(queue).arg(limits_text(limits));
            cmd
        };
        let _: i64 = cmd
            .query_async(&mut self.conn())
            .await
            .map_err(|err| map_err("set_limits", err))?;
        if limits.is_unlimited() {
            self.inner.limited.forget(&[queue.to_owned()]);
        } else {
            self.inner.limited.remember(&[queue.to_owned()]);
        }
        if limits.max_starts.is_none() || limits.max_starts_per_key.is_none() || !limits.fair_shares
        {
            let unfair = if limits.fair_shares { "" } else { queue };
            self.forget_what_limits_dropped(unfair).await?;
        }
        Ok(())
    }

    /// Deletes, before `set_limits` returns, every start log whose queue's limits no
    /// longer have its rate (CONTRACT K4: each rate taken away forgets its starts, so a
    /// rate set again counts only the starts after it), and the fair turns of queue
    /// `unfair` ('' for none; K5: fair shares set again start with the first key). One
    /// whole round of `forget_starts.lua` over `flow`, at the dawn of time: no log whose
    /// rate stands has left its window then, so only the unrated ones go. After the
    /// limits' own write, so no claim logs a start or moves a turn of the queue
    /// meanwhile.
    async fn forget_what_limits_dropped(&self, unfair: &str) -> Result<()> {
        let mut cursor = "0".to_owned();
        loop {
            cursor = self.forget_starts_step(0, &cursor, unfair).await?;
            if cursor == "0" {
                return Ok(());
            }
        }
    }

    /// One step of `forget_starts.lua` at `now` (ms) from HSCAN cursor `from`, the fair
    /// turns of queue `unfair` going too ('' for none); the next cursor.
    async fn forget_starts_step(&self, now: i64, from: &str, unfair: &str) -> Result<String> {
        let keys = self.keys();
        let mut step = Eval::new(&scripts::FORGET_STARTS);
        step.key(&keys.flow)
            .key(&keys.limits)
            .arg(now)
            .arg(from)
            .arg(SWEEP_PAGE)
            .arg(unfair);
        text(
            &self.eval(&step, "forget_starts").await?,
            "forget_starts reply",
        )
    }

    /// Rule K3: every queue's limits, by queue name.
    pub(crate) async fn all_limits(&self) -> Result<Vec<(String, QueueLimits)>> {
        let stored: Vec<(String, String)> = redis::cmd("HGETALL")
            .arg(&self.keys().limits)
            .query_async(&mut self.conn())
            .await
            .map_err(|err| map_err("limits", err))?;
        let mut all = stored
            .iter()
            .map(|(queue, text)| Ok((queue.clone(), parse_limits(queue, text)?)))
            .collect::<Result<Vec<_>>>()?;
        all.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(all)
    }

    /// The limits of `queue`, if it has any.
    async fn limits_of(&self, queue: &str) -> Result<Option<QueueLimits>> {
        let text: Option<String> = redis::cmd("HGET")
            .arg(&self.keys().limits)
            .arg(queue)
            .query_async(&mut self.conn())
            .await
            .map_err(|err| map_err("limits", err))?;
        text.map(|text| parse_limits(queue, &text)).transpose()
    }

    /// Rule K3: what `queue`'s limits hold back at `now`.
    pub(crate) async fn read_flow_status(&self, queue: &str, now: Timestamp) -> Result<FlowStatus> {
        let keys = self.keys();
        let (limits, running, queue_log): (Option<String>, Option<i64>, Option<Vec<u8>>) =
            redis::pipe()
                .cmd("HGET")
                .arg(&keys.limits)
                .arg(queue)
                .cmd("HGET")
                .arg(&keys.running)
                .arg(queue)
                .cmd("HGET")
                .arg(&keys.flow)
                .arg(format!("s {queue}"))
                .query_async(&mut self.conn())
                .await
                .map_err(|err| map_err("flow_status", err))?;
        let mut status = FlowStatus::new(u64::try_from(running.unwrap_or(0)).unwrap_or(0));
        let Some(limits) = limits.map(|text| parse_limits(queue, &text)).transpose()? else {
            return Ok(status);
        };
        if let Some(limit) = limits.max_running_per_key {
            status.keys_at_limit = self
                .running_by_key(queue)
                .await?
                .into_iter()
                .filter(|(_, running)| *running >= u64::from(limit))
                .take(FLOW_KEYS_SHOWN)
                .collect();
        }
        if let Some(rate) = limits.max_starts {
            let log = log_starts(&queue_log.unwrap_or_default(), "queue start log")?;
            status.next_start = window_frees_at(&log, rate, now);
        }
        if let Some(rate) = limits.max_starts_per_key {
            let mut full = self.full_key_windows(queue, rate, now).await?;
            full.truncate(FLOW_KEYS_SHOWN);
            status.keys_rate_limited = full;
        }
        Ok(status)
    }

    /// Each key of `queue` with running jobs and how many, by key: its `kleases`
    /// entries whose lease the lease index still holds.
    async fn running_by_key(&self, queue: &str) -> Result<Vec<(String, u64)>> {
        let keys = self.keys();
        let entries: Vec<String> = redis::cmd("ZRANGEBYLEX")
            .arg(&keys.kleases)
            .arg(format!("[{queue} "))
            .arg(format!("({queue}!"))
            .query_async(&mut self.conn())
            .await
            .map_err(|err| map_err("flow_status", err))?;
        if entries.is_empty() {
            return Ok(Vec::new());
        }
        // One ZSCORE each, pipelined (ZMSCORE needs Redis 6.2).
        let mut lookup = redis::pipe();
        for entry in &entries {
            lookup.cmd("ZSCORE").arg(&keys.leases).arg(format!(
                "{queue} {}",
                &entry[entry.len().saturating_sub(36)..]
            ));
        }
        let scores: Vec<Option<f64>> = lookup
            .query_async(&mut self.conn())
            .await
            .map_err(|err| map_err("flow_status", err))?;
        let mut by_key: Vec<(String, u64)> = Vec::new();
        for (entry, score) in entries.iter().zip(scores) {
            if score.is_none() {
                continue;
            }
            // `QUEUE HEXKEY ID`: the queue has no space, the id is the last 36 bytes.
            let hex = entry
                .get(queue.len() + 1..entry.len().saturating_sub(37))
                .ok_or_else(|| Error::corrupt("key lease index", entry.clone()))?;
            let key = unhex_key(hex, "key lease index")?;
            match by_key.last_mut() {
                Some((last, count)) if *last == key => *count += 1,
                _ => by_key.push((key, 1)),
            }
        }
        Ok(by_key)
    }

    /// The keys of `queue` whose start log fills `rate`'s window at `now`, by key, each
    /// with when it admits a start again.
    async fn full_key_windows(
        &self,
        queue: &str,
        rate: Rate,
        now: Timestamp,
    ) -> Result<Vec<(String, Timestamp)>> {
        let keys = self.keys();
        let prefix = format!("k {queue} ");
        let mut cursor = 0u64;
        let mut full = Vec::new();
        loop {
            let (next, fields): ScanPage = redis::cmd("HSCAN")
                .arg(&keys.flow)
                .arg(cursor)
                .arg("MATCH")
                .arg(format!("{prefix}*"))
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut self.conn())
                .await
                .map_err(|err| map_err("flow_status", err))?;
            for (field, log) in fields {
                let hex = std::str::from_utf8(&field[prefix.len().min(field.len())..])
                    .map_err(|_| Error::corrupt("start logs", "a field not UTF-8"))?;
                let key = unhex_key(hex, "start logs")?;
                if let Some(at) = window_frees_at(&log_starts(&log, "key start log")?, rate, now) {
                    full.push((key, at));
                }
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
        // HSCAN may return a field twice.
        full.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        full.dedup_by(|a, b| a.0 == b.0);
        Ok(full)
    }

    /// The earliest instant after `now` at which a rate of one of `queues` admits a
    /// start it holds back now (K4), if one does.
    pub(crate) async fn next_rate_free(
        &self,
        queues: &[String],
        now: Timestamp,
    ) -> Result<Option<Timestamp>> {
        let mut next: Option<Timestamp> = None;
        let mut earliest = |at: Timestamp| next = Some(next.map_or(at, |next| next.min(at)));
        for queue in queues {
            let Some(limits) = self.limits_of(queue).await? else {
                continue;
            };
            if let Some(rate) = limits.max_starts {
                let log: Option<Vec<u8>> = redis::cmd("HGET")
                    .arg(&self.keys().flow)
                    .arg(format!("s {queue}"))
                    .query_async(&mut self.conn())
                    .await
                    .map_err(|err| map_err("wait_for_work", err))?;
                let log = log_starts(&log.unwrap_or_default(), "queue start log")?;
                if let Some(at) = window_frees_at(&log, rate, now) {
                    earliest(at);
                }
            }
            if let Some(rate) = limits.max_starts_per_key {
                for (_, at) in self.full_key_windows(queue, rate, now).await? {
                    earliest(at);
                }
            }
        }
        Ok(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn limits_read_back_as_written() {
        let all = QueueLimits::new()
            .max_running(20)
            .max_running_per_key(1)
            .max_starts(Rate::new(10, Duration::from_secs(1)))
            .max_starts_per_key(Rate::new(2, Duration::from_millis(250)))
            .fair_shares(true);
        for limits in [
            all,
            QueueLimits::new().max_running(3),
            QueueLimits::new().fair_shares(true),
        ] {
            let text = limits_text(limits);
            assert_eq!(parse_limits("q", &text).ok(), Some(limits), "{text}");
        }
        assert_eq!(limits_text(all), "20 1 10 1000 2 250 1");
        for bad in [
            "",
            "1 - - - - - 2",
            "0 - - - - - 0",
            "x - - - - - 0",
            "- - 5 - - - 0",
        ] {
            assert!(
                matches!(parse_limits("q", bad), Err(Error::Corrupt { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_full_window_frees_when_its_starts_th_newest_start_leaves_it() {
        let rate = Rate::new(2, Duration::from_millis(100));
        let now = Timestamp::from_millis(1_000);
        assert_eq!(window_frees_at(&[950], rate, now), None);
        assert_eq!(
            window_frees_at(&[800, 950, 990], rate, now),
            Some(Timestamp::from_millis(1_050))
        );
        // A start at the window's opening instant has left it.
        assert_eq!(window_frees_at(&[900, 990], rate, now), None);
        assert_eq!(
            log_starts(b"000000000000950000000000000990", "log").ok(),
            Some(vec![950, 990])
        );
        assert!(log_starts(b"00000000000095", "log").is_err());
    }
}
