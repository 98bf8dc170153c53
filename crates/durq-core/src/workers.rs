//! Live workers (CONTRACT W1–W4): what a running worker records about itself, and the
//! stored form backends keep as opaque text beside the two fields they update.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::time::Timestamp;
use crate::validate;

/// The most bytes of a worker's host name.
pub const MAX_HOST_BYTES: usize = 256;

/// A running worker as the store records it (CONTRACT W1): who it is, where it runs,
/// what it serves, how busy it is, and when it was last heard of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerInfo {
    /// The worker's id, as in its leases (`ClaimRequest::worker`).
    pub id: String,
    /// The host it runs on.
    pub host: String,
    /// Its process id on that host.
    pub pid: u32,
    /// The queues it serves.
    pub queues: Vec<String>,
    /// How many jobs it runs at once.
    pub concurrency: u32,
    /// How many jobs it was running when it last reported (register, heartbeat).
    pub in_flight: u32,
    /// When it registered, on the store's clock.
    pub started_at: Timestamp,
    /// When it last registered or sent a heartbeat, on the store's clock.
    pub last_seen: Timestamp,
}

impl WorkerInfo {
    /// A worker about to register: `in_flight` 0, `started_at` and `last_seen` set by
    /// [`Store::register_worker`](crate::Store::register_worker) to its clock's now.
    pub fn new(
        id: impl Into<String>,
        host: impl Into<String>,
        pid: u32,
        queues: Vec<String>,
        concurrency: u32,
    ) -> Self {
        WorkerInfo {
            id: id.into(),
            host: host.into(),
            pid,
            queues,
            concurrency,
            in_flight: 0,
            started_at: Timestamp::from_millis(0),
            last_seen: Timestamp::from_millis(0),
        }
    }

    /// Checks what a backend will store: the id as a lease's worker id, the queues as a
    /// claim's, the host's length.
    pub fn validate(&self) -> Result<()> {
        validate::validate_worker(&self.id)?;
        validate::validate_queues(&self.queues)?;
        if self.host.len() > MAX_HOST_BYTES {
            return Err(Error::invalid(
                "host",
                format!("{} bytes, at most {MAX_HOST_BYTES}", self.host.len()),
            ));
        }
        Ok(())
    }

    /// The text a backend stores for this worker: everything but `in_flight` and
    /// `last_seen`, which the backend keeps apart because heartbeats change them.
    pub fn to_spec(&self) -> Result<String> {
        serde_json::to_string(&Spec {
            host: &self.host,
            pid: self.pid,
            queues: &self.queues,
            concurrency: self.concurrency,
            started_at: self.started_at.as_millis(),
        })
        .map_err(|err| Error::invalid("worker", format!("cannot be stored: {err}")))
    }

    /// The worker a backend's record describes.
    pub fn from_stored(stored: &StoredWorker) -> Result<Self> {
        let spec: OwnedSpec = serde_json::from_str(&stored.spec).map_err(|err| {
            Error::corrupt(
                format!("worker {}", stored.id),
                format!("unreadable: {err}"),
            )
        })?;
        Ok(WorkerInfo {
            id: stored.id.clone(),
            host: spec.host,
            pid: spec.pid,
            queues: spec.queues,
            concurrency: spec.concurrency,
            in_flight: stored.in_flight,
            started_at: Timestamp::from_millis(spec.started_at),
            last_seen: stored.last_seen,
        })
    }
}

#[derive(Serialize)]
struct Spec<'a> {
    host: &'a str,
    pid: u32,
    queues: &'a [String],
    concurrency: u32,
    started_at: i64,
}

#[derive(Deserialize)]
struct OwnedSpec {
    host: String,
    pid: u32,
    queues: Vec<String>,
    concurrency: u32,
    started_at: i64,
}

/// A worker as a backend stores it: [`WorkerInfo::to_spec`] is opaque to the backend,
/// which keeps the two fields heartbeats change beside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredWorker {
    /// The worker's id.
    pub id: String,
    /// [`WorkerInfo::to_spec`].
    pub spec: String,
    /// Jobs in flight at its last report.
    pub in_flight: u32,
    /// Its last report.
    pub last_seen: Timestamp,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_round_trips_through_its_stored_form() {
        let mut info = WorkerInfo::new("w-1", "box-7", 4242, vec!["a".into(), "b".into()], 16);
        info.started_at = Timestamp::from_millis(1_000);
        let stored = StoredWorker {
            id: "w-1".into(),
            spec: info.to_spec().expect("spec"),
            in_flight: 3,
            last_seen: Timestamp::from_millis(2_000),
        };
        let back = WorkerInfo::from_stored(&stored).expect("decodes");
        assert_eq!(
            back,
            WorkerInfo {
                in_flight: 3,
                last_seen: Timestamp::from_millis(2_000),
                ..info
            }
        );
        let broken = StoredWorker {
            spec: "{".into(),
            ..stored
        };
        assert!(matches!(
            WorkerInfo::from_stored(&broken),
            Err(Error::Corrupt { .. })
        ));
    }

    #[test]
    fn bad_workers_are_refused() {
        let good = WorkerInfo::new("w", "h", 1, vec!["q".into()], 1);
        assert!(good.validate().is_ok());
        let bad_id = WorkerInfo::new("", "h", 1, vec!["q".into()], 1);
        assert!(bad_id.validate().is_err());
        let bad_queue = WorkerInfo::new("w", "h", 1, vec!["no spaces".into()], 1);
        assert!(bad_queue.validate().is_err());
        let long_host =
            WorkerInfo::new("w", "h".repeat(MAX_HOST_BYTES + 1), 1, vec!["q".into()], 1);
        assert!(matches!(
            long_host.validate(),
            Err(Error::InvalidInput { field: "host", .. })
        ));
    }
}
