//! `queues`, `workers`, `stats` and `schedules`: what the store holds, read only.

use std::collections::{BTreeMap, BTreeSet};

use durq::{Cadence, Job, JobState, ListQuery};
use serde::Serialize;

use crate::format::{self, age, ago, fields, maybe_time, table};
use crate::view::{JobJson, QueueJson, ScheduleJson, StatsJson, WorkerJson};
use crate::{Context, Result};

/// `durq queues`: every queue of the namespace, with its counts per state, whether it is
/// paused, and its lag (how long its oldest ready job has waited).
pub async fn queues(cx: &mut Context<'_>) -> Result<()> {
    let queues = cx.store.queues().await?;
    if cx.json {
        #[derive(Serialize)]
        struct Doc<'a> {
            queues: Vec<QueueJson<'a>>,
        }
        let queues = queues.iter().map(QueueJson::new).collect();
        return cx.print_json(&Doc { queues });
    }
    if queues.is_empty() {
        let namespace = &cx.store.settings().namespace;
        return cx.print(&format!(
            "(no queues in namespace {namespace:?}; another namespace: -n NAME)\n"
        ));
    }
    let rows = queues
        .iter()
        .map(|q| {
            let s = &q.stats;
            vec![
                q.queue.clone(),
                s.waiting.to_string(),
                s.ready.to_string(),
                s.scheduled.to_string(),
                s.running.to_string(),
                s.succeeded.to_string(),
                s.dead.to_string(),
                s.cancelled.to_string(),
                yes_no(s.paused).to_owned(),
                q.lag.map_or_else(|| "-".to_owned(), age),
            ]
        })
        .collect();
    let headers = [
        "QUEUE",
        "WAITING",
        "READY",
        "SCHEDULED",
        "RUNNING",
        "SUCCEEDED",
        "DEAD",
        "CANCELLED",
        "PAUSED",
        "LAG",
    ];
    cx.print(&table(&headers, &[1, 2, 3, 4, 5, 6, 7, 9], rows))
}

/// `durq stats --queue QUEUE`: one queue's counts per state, and whether it is paused.
pub async fn stats(cx: &mut Context<'_>, queue: &str) -> Result<()> {
    let stats = cx.store.stats(queue).await?;
    if cx.json {
        return cx.print_json(&StatsJson::new(queue, &stats));
    }
    cx.print(&fields(&[
        ("queue", queue.to_owned()),
        ("waiting", stats.waiting.to_string()),
        ("ready", stats.ready.to_string()),
        ("scheduled", stats.scheduled.to_string()),
        ("running", stats.running.to_string()),
        ("succeeded", stats.succeeded.to_string()),
        ("dead", stats.dead.to_string()),
        ("cancelled", stats.cancelled.to_string()),
        ("total", stats.total().to_string()),
        ("paused", yes_no(stats.paused).to_owned()),
    ]))
}

/// `durq workers`: the live workers, and the jobs running under their leases.
pub async fn workers(cx: &mut Context<'_>) -> Result<()> {
    let workers = cx.store.workers().await?;
    let served: BTreeSet<&str> = workers
        .iter()
        .flat_map(|w| w.queues.iter().map(String::as_str))
        .collect();
    let mut running = Vec::new();
    for queue in served {
        running.extend(every_job(cx, queue, JobState::Running).await?);
    }
    let mut by_worker: BTreeMap<&str, Vec<&Job>> = BTreeMap::new();
    for job in &running {
        if let Some(lease) = &job.lease {
            by_worker
                .entry(lease.worker.as_str())
                .or_default()
                .push(job);
        }
    }
    let now = cx.store.now();
    if cx.json {
        #[derive(Serialize)]
        struct Doc<'a> {
            workers: Vec<WorkerJson<'a>>,
        }
        let workers = workers
            .iter()
            .map(|w| {
                let jobs = by_worker.get(w.id.as_str()).map_or(&[][..], Vec::as_slice);
                WorkerJson::new(w, jobs.iter().map(|job| JobJson::new(job, now)).collect())
            })
            .collect();
        return cx.print_json(&Doc { workers });
    }
    if workers.is_empty() {
        return cx.print("(no live workers)\n");
    }
    let rows = workers
        .iter()
        .map(|w| {
            vec![
                w.id.clone(),
                w.host.clone(),
                w.pid.to_string(),
                w.queues.join(","),
                format!("{}/{}", w.in_flight, w.concurrency),
                format!(
                    "{} ({})",
                    format::time(w.started_at),
                    ago(w.started_at, now)
                ),
                ago(w.last_seen, now),
            ]
        })
        .collect();
    let headers = [
        "WORKER",
        "HOST",
        "PID",
        "QUEUES",
        "IN FLIGHT",
        "STARTED",
        "LAST SEEN",
    ];
    let mut text = table(&headers, &[2, 4], rows);
    let mut jobs = Vec::new();
    for w in &workers {
        for job in by_worker.get(w.id.as_str()).into_iter().flatten() {
            let expires = job.lease.as_ref().map(|lease| lease.expires_at);
            jobs.push(vec![
                w.id.clone(),
                job.id.to_string(),
                job.queue.clone(),
                format!("{}/{}", job.attempts, job.max_attempts),
                job.started_at
                    .map_or_else(|| "-".to_owned(), |t| ago(t, now)),
                maybe_time(expires),
            ]);
        }
    }
    if !jobs.is_empty() {
        text.push_str("\nrunning jobs:\n");
        let headers = [
            "WORKER",
            "JOB",
            "QUEUE",
            "ATTEMPT",
            "STARTED",
            "LEASE EXPIRES",
        ];
        text.push_str(&table(&headers, &[3], jobs));
    }
    cx.print(&text)
}

/// Every job of `queue` in `state`, following the pages to the end.
pub(crate) async fn every_job(cx: &Context<'_>, queue: &str, state: JobState) -> Result<Vec<Job>> {
    let mut jobs = Vec::new();
    let mut query = ListQuery::new(queue)
        .state(state)
        .limit(durq_core::validate::MAX_LIST_LIMIT);
    loop {
        let page = cx.store.list(query.clone()).await?;
        jobs.extend(page.jobs);
        match page.next {
            Some(next) => query = query.after(next),
            None => return Ok(jobs),
        }
    }
}

/// `durq limits`: every queue's limits on its running jobs (CONTRACT K3).
pub async fn limits(cx: &mut Context<'_>) -> Result<()> {
    let all = cx.store.all_limits().await?;
    if cx.json {
        #[derive(Serialize)]
        struct Doc<'a> {
            limits: Vec<LimitsJson<'a>>,
        }
        let limits = all
            .iter()
            .map(|(queue, limits)| LimitsJson::new(queue, limits))
            .collect();
        return cx.print_json(&Doc { limits });
    }
    if all.is_empty() {
        return cx.print("(no queue has limits)\n");
    }
    let count = |limit: Option<u32>| limit.map_or_else(|| "-".to_owned(), |n| n.to_string());
    let rate =
        |rate: Option<durq_core::Rate>| rate.map_or_else(|| "-".to_owned(), |r| r.to_string());
    let rows = all
        .iter()
        .map(|(queue, limits)| {
            vec![
                queue.clone(),
                count(limits.max_running),
                count(limits.max_running_per_key),
                rate(limits.max_starts),
                rate(limits.max_starts_per_key),
                if limits.fair_shares { "yes" } else { "-" }.to_owned(),
            ]
        })
        .collect();
    cx.print(&table(
        &[
            "QUEUE",
            "MAX RUNNING",
            "MAX RUNNING PER KEY",
            "MAX STARTS",
            "MAX STARTS PER KEY",
            "FAIR SHARES",
        ],
        &[1, 2, 3, 4],
        rows,
    ))
}

/// `durq limits status QUEUE`: what the queue's limits hold back now.
pub async fn flow_status(cx: &mut Context<'_>, queue: &str) -> Result<()> {
    let status = cx.store.flow_status(queue).await?;
    let now = cx.store.settings().now();
    if cx.json {
        #[derive(Serialize)]
        struct KeyRunning<'a> {
            key: &'a str,
            running: u64,
        }
        #[derive(Serialize)]
        struct KeyHeld<'a> {
            key: &'a str,
            until: String,
        }
        #[derive(Serialize)]
        struct Doc<'a> {
            queue: &'a str,
            running: u64,
            keys_at_limit: Vec<KeyRunning<'a>>,
            next_start: Option<String>,
            keys_rate_limited: Vec<KeyHeld<'a>>,
        }
        return cx.print_json(&Doc {
            queue,
            running: status.running,
            keys_at_limit: status
                .keys_at_limit
                .iter()
                .map(|(key, running)| KeyRunning {
                    key,
                    running: *running,
                })
                .collect(),
            next_start: status.next_start.map(format::time_ms),
            keys_rate_limited: status
                .keys_rate_limited
                .iter()
                .map(|(key, until)| KeyHeld {
                    key,
                    until: format::time_ms(*until),
                })
                .collect(),
        });
    }
    let mut out = format!("queue {queue}: {} running\n", status.running);
    let listed = |keys: Vec<String>| {
        if keys.is_empty() {
            "none".to_owned()
        } else {
            keys.join(", ")
        }
    };
    out.push_str(&format!(
        "keys at their running limit: {}\n",
        listed(
            status
                .keys_at_limit
                .iter()
                .map(|(key, running)| format!("{key} ({running} running)"))
                .collect()
        )
    ));
    out.push_str(&format!(
        "next start: {}\n",
        status.next_start.map_or_else(
            || "now (the queue's rate admits one)".to_owned(),
            |at| format::ago(at, now)
        )
    ));
    out.push_str(&format!(
        "keys at their rate: {}\n",
        listed(
            status
                .keys_rate_limited
                .iter()
                .map(|(key, until)| format!("{key} (next start {})", format::ago(*until, now)))
                .collect()
        )
    ));
    cx.print(&out)
}

/// One queue's limits in JSON (`durq limits`, `durq limits set`): absent limits are
/// `null`.
#[derive(Serialize)]
pub(crate) struct LimitsJson<'a> {
    queue: &'a str,
    max_running: Option<u32>,
    max_running_per_key: Option<u32>,
    /// `STARTS/PERIOD`, as `--max-starts` reads it.
    max_starts: Option<String>,
    max_starts_per_key: Option<String>,
    fair_shares: bool,
}

impl<'a> LimitsJson<'a> {
    pub(crate) fn new(queue: &'a str, limits: &durq_core::QueueLimits) -> Self {
        LimitsJson {
            queue,
            max_running: limits.max_running,
            max_running_per_key: limits.max_running_per_key,
            max_starts: limits.max_starts.map(|rate| rate.to_string()),
            max_starts_per_key: limits.max_starts_per_key.map(|rate| rate.to_string()),
            fair_shares: limits.fair_shares,
        }
    }
}

/// `durq schedules`: every periodic job, its cadence, whether it is enabled, and its
/// last and next run.
pub async fn schedules(cx: &mut Context<'_>) -> Result<()> {
    let schedules = cx.store.schedules().await?;
    if cx.json {
        #[derive(Serialize)]
        struct Doc<'a> {
            schedules: Vec<ScheduleJson<'a>>,
        }
        let schedules = schedules.iter().map(ScheduleJson::new).collect();
        return cx.print_json(&Doc { schedules });
    }
    if schedules.is_empty() {
        return cx.print("(no schedules)\n");
    }
    let rows = schedules
        .iter()
        .map(|record| {
            let cadence = match &record.schedule.cadence {
                Cadence::Cron {
                    expression,
                    time_zone,
                } => format!("cron {expression} ({time_zone})"),
                Cadence::Every(interval) => {
                    format!("every {}", humantime::format_duration(*interval))
                }
            };
            vec![
                record.schedule.name.clone(),
                cadence,
                record.schedule.job.queue.clone(),
                yes_no(record.enabled).to_owned(),
                format::time(record.last_tick),
                maybe_time(record.next_tick),
            ]
        })
        .collect();
    let headers = [
        "NAME", "CADENCE", "QUEUE", "ENABLED", "LAST RUN", "NEXT RUN",
    ];
    cx.print(&table(&headers, &[], rows))
}

fn yes_no(value: bool) -> &'static str {
    if value {
        "yes"
    } else {
        "no"
    }
}
