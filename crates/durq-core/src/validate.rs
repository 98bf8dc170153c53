//! Validation of every input, written once: the [`Store`](crate::Store) handle calls it
//! before any backend sees a request (CONTRACT E7).

use std::time::Duration;

use crate::error::{Error, Result};
use crate::graph::{Dependency, MAX_DEPENDENCIES};
use crate::model::{ClaimRequest, ListQuery, NewJob, StoreSettings, Uniqueness};

/// Longest queue name, in bytes.
pub const MAX_QUEUE_BYTES: usize = 128;
/// Longest tenant, in bytes.
pub const MAX_TENANT_BYTES: usize = 256;
/// Longest concurrency key, in bytes (CONTRACT K1).
pub const MAX_CONCURRENCY_KEY_BYTES: usize = 256;
/// Longest idempotency key, in bytes.
pub const MAX_IDEMPOTENCY_KEY_BYTES: usize = 512;
/// Longest worker id, in bytes.
pub const MAX_WORKER_BYTES: usize = 256;
/// Longest namespace, in bytes.
pub const MAX_NAMESPACE_BYTES: usize = 64;
/// The most jobs one claim may ask for; larger batches hold a backend's lock or a
/// Redis script too long for no gain.
pub const MAX_CLAIM_LIMIT: usize = 10_000;
/// The most jobs one `list` page may hold.
pub const MAX_LIST_LIMIT: usize = 1_000;
/// The most jobs one enqueue batch may hold.
pub const MAX_BATCH_LEN: usize = 10_000;
/// Longest `last_error` kept; longer messages are cut at a character boundary.
pub const MAX_ERROR_BYTES: usize = 64 * 1024;
/// Longest error text of one attempt's record (CONTRACT H2), in bytes.
pub const MAX_ATTEMPT_ERROR_BYTES: usize = 4 * 1024;
/// Longest amount name or capability key of a job's needs or a claim's budget, in bytes.
pub const MAX_FIT_KEY_BYTES: usize = 64;
/// The most amounts, and the most capabilities, one job may need or one budget offer.
pub const MAX_FIT_KEYS: usize = 32;
/// The largest amount: 2^53 - 1, so every backend compares it exactly (a Lua number is
/// a double).
pub const MAX_AMOUNT: u64 = (1 << 53) - 1;
/// Longest locality, in bytes.
pub const MAX_LOCALITY_BYTES: usize = 256;
/// The most localities one claim may prefer.
pub const MAX_PREFERRED: usize = 64;
/// The longest lease or heartbeat extension: a year. Longer is surely a unit mistake.
pub const MAX_LEASE_TTL: Duration = Duration::from_secs(366 * 24 * 60 * 60);

fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-')
}

pub(crate) fn validate_name(field: &'static str, value: &str, max: usize) -> Result<()> {
    if value.is_empty() {
        return Err(Error::invalid(field, "must not be empty"));
    }
    if value.len() > max {
        return Err(Error::invalid(
            field,
            format!("is {} bytes, the limit is {max}", value.len()),
        ));
    }
    if let Some(bad) = value.bytes().find(|b| !is_name_byte(*b)) {
        return Err(Error::invalid(
            field,
            format!("holds byte {bad:#04x}; allowed are A-Z a-z 0-9 . _ : -"),
        ));
    }
    Ok(())
}

/// A queue name: `[A-Za-z0-9._:-]`, 1..=128 bytes.
pub fn validate_queue(queue: &str) -> Result<()> {
    validate_name("queue", queue, MAX_QUEUE_BYTES)
}

/// A namespace: `[A-Za-z0-9._:-]`, 1..=64 bytes.
pub fn validate_namespace(namespace: &str) -> Result<()> {
    validate_name("namespace", namespace, MAX_NAMESPACE_BYTES)
}

/// A step name (CONTRACT D1): `[A-Za-z0-9._:-]`, 1..=128 bytes.
pub fn validate_step(step: &str) -> Result<()> {
    validate_name("step", step, crate::steps::MAX_STEP_BYTES)
}

/// An emitted event: its name as a step's, `[A-Za-z0-9._:-]{1,128}` (`event`), and its
/// data at most [`MAX_EVENT_DATA_BYTES`](crate::events::MAX_EVENT_DATA_BYTES) (`data`).
pub fn validate_event(name: &str, data_len: usize) -> Result<()> {
    validate_name("event", name, crate::steps::MAX_STEP_BYTES)?;
    let max = crate::events::MAX_EVENT_DATA_BYTES;
    if data_len > max {
        return Err(Error::PayloadTooLarge {
            field: "data",
            size: data_len,
            max,
        });
    }
    Ok(())
}

/// The length of one read of the event stream: 1..=
/// [`MAX_EVENTS_PAGE`](crate::events::MAX_EVENTS_PAGE) (`limit`).
pub fn validate_events_limit(limit: usize) -> Result<()> {
    let max = crate::events::MAX_EVENTS_PAGE;
    if limit == 0 || limit > max {
        return Err(Error::invalid("limit", format!("must be 1..={max}")));
    }
    Ok(())
}

/// How many events a trim keeps: at least 1 (`keep`).
pub fn validate_events_kept(keep: u64) -> Result<()> {
    if keep == 0 {
        return Err(Error::invalid("keep", "must be at least 1"));
    }
    Ok(())
}

/// A worker id: any UTF-8, 1..=256 bytes.
pub fn validate_worker(worker: &str) -> Result<()> {
    if worker.is_empty() || worker.len() > MAX_WORKER_BYTES {
        return Err(Error::invalid(
            "worker",
            format!("must be 1..={MAX_WORKER_BYTES} bytes"),
        ));
    }
    Ok(())
}

/// A lease length: at least a millisecond, at most [`MAX_LEASE_TTL`].
pub fn validate_lease_ttl(ttl: Duration) -> Result<()> {
    if ttl < Duration::from_millis(1) || ttl > MAX_LEASE_TTL {
        return Err(Error::invalid(
            "lease_ttl",
            "must be between 1 ms and 366 days",
        ));
    }
    Ok(())
}

/// A payload or result against the store's size limit.
pub fn validate_size(field: &'static str, size: usize, settings: &StoreSettings) -> Result<()> {
    if size > settings.max_payload_bytes {
        return Err(Error::PayloadTooLarge {
            field,
            size,
            max: settings.max_payload_bytes,
        });
    }
    Ok(())
}

/// Every field of a new job (CONTRACT E7). Whether `parent` exists is for the backend
/// to check, inside the same transaction as the insert; so is whether each job of
/// `depends_on` does (G1).
pub fn validate_new_job(job: &NewJob, settings: &StoreSettings) -> Result<()> {
    validate_job_at(job, None, settings)
}

/// [`validate_new_job`] for the job at `position` of a batch (`None`: enqueued alone),
/// which decides which [`Dependency::Earlier`]s it may name (G2).
fn validate_job_at(job: &NewJob, position: Option<usize>, settings: &StoreSettings) -> Result<()> {
    validate_queue(&job.queue)?;
    if job.tenant.len() > MAX_TENANT_BYTES {
        return Err(Error::invalid(
            "tenant",
            format!(
                "is {} bytes, the limit is {MAX_TENANT_BYTES}",
                job.tenant.len()
            ),
        ));
    }
    if let Some(key) = &job.idempotency_key {
        if key.is_empty() || key.len() > MAX_IDEMPOTENCY_KEY_BYTES {
            return Err(Error::invalid(
                "idempotency_key",
                format!(
                    "is {} bytes, it must be 1..={MAX_IDEMPOTENCY_KEY_BYTES}",
                    key.len()
                ),
            ));
        }
    } else if job.uniqueness != Uniqueness::Window {
        return Err(Error::invalid(
            "uniqueness",
            "unique while active needs an idempotency key",
        ));
    }
    validate_size("payload", job.payload.len(), settings)?;
    if job.max_attempts == 0 {
        return Err(Error::invalid("max_attempts", "must be at least 1"));
    }
    if let Some(timeout) = job.timeout {
        validate_timeout(timeout)?;
    }
    validate_fit_keys("needs", job.needs.amounts(), job.needs.capabilities())?;
    if let Some(locality) = &job.locality {
        validate_locality("locality", locality)?;
    }
    crate::meta::validate_tags("tags", &job.tags)?;
    if let Some(traceparent) = &job.trace_context {
        crate::meta::validate_trace_context(traceparent)?;
    }
    if let Some(key) = &job.concurrency_key {
        if key.is_empty() || key.len() > MAX_CONCURRENCY_KEY_BYTES {
            return Err(Error::invalid(
                "concurrency_key",
                format!(
                    "is {} bytes, it must be 1..={MAX_CONCURRENCY_KEY_BYTES}",
                    key.len()
                ),
            ));
        }
    }
    validate_dependencies(&job.depends_on, position)
}

/// Rules G1, G2: at most [`MAX_DEPENDENCIES`] jobs to wait for, and each
/// [`Dependency::Earlier`] names a job before this one in its batch, so no batch can
/// build a cycle (a job enqueued alone has nothing earlier).
fn validate_dependencies(dependencies: &[Dependency], position: Option<usize>) -> Result<()> {
    if dependencies.len() > MAX_DEPENDENCIES {
        return Err(Error::invalid(
            "depends_on",
            format!("a job waits for at most {MAX_DEPENDENCIES} jobs"),
        ));
    }
    for dependency in dependencies {
        if let Dependency::Earlier(index) = *dependency {
            match position {
                Some(position) if index < position => {}
                Some(position) => {
                    return Err(Error::invalid(
                        "depends_on",
                        format!(
                            "job {position} of the batch names job {index}: a job may wait \
                             only for jobs before it in its batch"
                        ),
                    ))
                }
                None => {
                    return Err(Error::invalid(
                        "depends_on",
                        "names a job of a batch, and this job is enqueued alone",
                    ))
                }
            }
        }
    }
    Ok(())
}

/// Rule G1: jobs that wait for jobs are refused, naming `depends_on`, by a backend
/// that does not keep dependencies ([`crate::Capabilities::dependencies`]): it would
/// run them at once. The [`crate::Store`] calls it for such backends.
pub fn refuse_dependencies<'a>(jobs: impl IntoIterator<Item = &'a NewJob>) -> Result<()> {
    if jobs.into_iter().any(|job| !job.depends_on.is_empty()) {
        return Err(Error::invalid(
            "depends_on",
            "needs a backend that keeps dependencies (Capabilities::dependencies), and \
             this one does not",
        ));
    }
    Ok(())
}

/// Rule K3: jobs with a concurrency key are refused, naming `concurrency_key`, by a
/// backend without flow control ([`crate::FlowControl`]): it would not store the key,
/// and the queue's limits could not hold. The [`crate::Store`] calls it for backends
/// that do not declare the capability; a backend's own enqueue paths (in a caller's
/// transaction) call it while they do not.
pub fn refuse_concurrency_keys<'a>(jobs: impl IntoIterator<Item = &'a NewJob>) -> Result<()> {
    if jobs.into_iter().any(|job| job.concurrency_key.is_some()) {
        return Err(Error::invalid(
            "concurrency_key",
            "needs a backend with flow control (the FlowControl capability), and this \
             one does not declare it",
        ));
    }
    Ok(())
}

/// The amounts and capabilities of a job's needs or a claim's budget (CONTRACT F1):
/// names `[A-Za-z0-9._:-]`, 1..=64 bytes, at most 32 of each, amounts at most
/// [`MAX_AMOUNT`].
pub fn validate_fit_keys(
    field: &'static str,
    amounts: &std::collections::BTreeMap<String, u64>,
    capabilities: &std::collections::BTreeSet<String>,
) -> Result<()> {
    if amounts.len() > MAX_FIT_KEYS || capabilities.len() > MAX_FIT_KEYS {
        return Err(Error::invalid(
            field,
            format!("at most {MAX_FIT_KEYS} amounts and {MAX_FIT_KEYS} capabilities"),
        ));
    }
    for (name, amount) in amounts {
        validate_name(field, name, MAX_FIT_KEY_BYTES)?;
        if *amount > MAX_AMOUNT {
            return Err(Error::invalid(
                field,
                format!("amount {name} is {amount}, the limit is {MAX_AMOUNT}"),
            ));
        }
    }
    for key in capabilities {
        validate_name(field, key, MAX_FIT_KEY_BYTES)?;
    }
    Ok(())
}

fn validate_locality(field: &'static str, locality: &str) -> Result<()> {
    if locality.is_empty() || locality.len() > MAX_LOCALITY_BYTES {
        return Err(Error::invalid(
            field,
            format!(
                "is {} bytes, it must be 1..={MAX_LOCALITY_BYTES}",
                locality.len()
            ),
        ));
    }
    if locality.chars().any(char::is_control) {
        return Err(Error::invalid(field, "must not hold control characters"));
    }
    Ok(())
}

/// A job's timeout: whole milliseconds, above zero, at most [`MAX_LEASE_TTL`], so every
/// backend stores it exactly.
pub fn validate_timeout(timeout: Duration) -> Result<()> {
    if timeout.is_zero() || timeout > MAX_LEASE_TTL || timeout.subsec_nanos() % 1_000_000 != 0 {
        return Err(Error::invalid(
            "timeout",
            "must be whole milliseconds, above zero and at most 366 days",
        ));
    }
    Ok(())
}

/// A batch of new jobs: each job, and the batch's length. A batch with one bad job is
/// refused whole, so a caller never has to find out which half was written.
pub fn validate_batch(jobs: &[NewJob], settings: &StoreSettings) -> Result<()> {
    if jobs.len() > MAX_BATCH_LEN {
        return Err(Error::invalid(
            "jobs",
            format!("a batch holds at most {MAX_BATCH_LEN} jobs"),
        ));
    }
    jobs.iter()
        .enumerate()
        .try_for_each(|(position, job)| validate_job_at(job, Some(position), settings))
}

/// A claim's arguments (CONTRACT C1): at least one valid queue, a worker, a lease.
pub fn validate_claim(request: &ClaimRequest) -> Result<()> {
    validate_queues(&request.queues)?;
    validate_worker(&request.worker)?;
    validate_lease_ttl(request.lease_ttl)?;
    if request.limit > MAX_CLAIM_LIMIT {
        return Err(Error::invalid(
            "limit",
            format!("a claim takes at most {MAX_CLAIM_LIMIT} jobs"),
        ));
    }
    if let Some(budget) = &request.budget {
        validate_fit_keys("budget", &budget.amounts, &budget.capabilities)?;
    }
    if request.prefer.len() > MAX_PREFERRED {
        return Err(Error::invalid(
            "prefer",
            format!("a claim prefers at most {MAX_PREFERRED} localities"),
        ));
    }
    for locality in &request.prefer {
        validate_locality("prefer", locality)?;
    }
    Ok(())
}

/// The queues of a claim or a wait (CONTRACT C1): at least one, each valid, none named
/// twice. A repeated name would let a backend that looks each queue up in turn hand one
/// job out twice in one claim; refusing it keeps every backend's answer the same.
pub fn validate_queues(queues: &[String]) -> Result<()> {
    if queues.is_empty() {
        return Err(Error::invalid("queues", "name at least one queue"));
    }
    for (i, queue) in queues.iter().enumerate() {
        validate_queue(queue)?;
        if queues[..i].contains(queue) {
            return Err(Error::invalid(
                "queues",
                format!("queue {queue} is named twice"),
            ));
        }
    }
    Ok(())
}

/// A `list` page request (CONTRACT A4): its queue and queue prefix are names (a prefix
/// holding a byte no queue name holds is refused, not matched to nothing), its tenant
/// and tags within the limits of a job's.
pub fn validate_list(query: &ListQuery) -> Result<()> {
    if let Some(queue) = &query.queue {
        validate_queue(queue)?;
    }
    if let Some(prefix) = &query.queue_prefix {
        validate_name("queue_prefix", prefix, MAX_QUEUE_BYTES)?;
    }
    if let Some(tenant) = query
        .tenant
        .as_deref()
        .filter(|t| t.len() > MAX_TENANT_BYTES)
    {
        return Err(Error::invalid(
            "tenant",
            format!("is {} bytes, the limit is {MAX_TENANT_BYTES}", tenant.len()),
        ));
    }
    crate::meta::validate_tags("tags", &query.tags)?;
    if query.limit == 0 || query.limit > MAX_LIST_LIMIT {
        return Err(Error::invalid(
            "limit",
            format!("a page holds 1..={MAX_LIST_LIMIT} jobs"),
        ));
    }
    Ok(())
}

/// The settings of a store being opened.
pub fn validate_settings(settings: &StoreSettings) -> Result<()> {
    validate_namespace(&settings.namespace)?;
    if settings.max_payload_bytes == 0 {
        return Err(Error::invalid("max_payload_bytes", "must be at least 1"));
    }
    if let Some(keep) = settings.events_kept {
        validate_events_kept(keep)?;
    }
    Ok(())
}

/// Cuts an error message to [`MAX_ERROR_BYTES`] at a character boundary, so one huge
/// panic message cannot bloat every later read of the job.
pub fn truncate_error(message: &str) -> &str {
    cut_at(message, MAX_ERROR_BYTES)
}

/// Cuts the error of an attempt's record to [`MAX_ATTEMPT_ERROR_BYTES`] at a character
/// boundary (CONTRACT H2): a job keeps up to 32 of them, where it keeps one `last_error`.
pub fn truncate_attempt_error(message: &str) -> &str {
    cut_at(message, MAX_ATTEMPT_ERROR_BYTES)
}

/// `text`'s first `limit` bytes at most, ending on a character boundary.
fn cut_at(text: &str, limit: usize) -> &str {
    if text.len() <= limit {
        return text;
    }
    let mut end = limit;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_names_are_checked_byte_by_byte() {
        assert!(validate_queue("emails.high:v2_x-1").is_ok());
        assert_eq!(
            validate_queue("").err().and_then(|e| e.invalid_field()),
            Some("queue")
        );
        assert!(validate_queue("with space").is_err());
        assert!(validate_queue("ünïcode").is_err());
        assert!(validate_queue(&"q".repeat(128)).is_ok());
        assert!(validate_queue(&"q".repeat(129)).is_err());
    }

    #[test]
    fn new_job_limits_name_their_field() {
        let settings = StoreSettings::default().max_payload_bytes(8);
        let field = |job: NewJob| {
            validate_new_job(&job, &settings)
                .err()
                .and_then(|e| e.invalid_field())
        };
        assert_eq!(field(NewJob::new("q")), None);
        assert_eq!(
            field(NewJob::new("q").tenant("t".repeat(257))),
            Some("tenant")
        );
        assert_eq!(field(NewJob::new("q").tenant("t".repeat(256))), None);
        assert_eq!(
            field(NewJob::new("q").idempotency_key("")),
            Some("idempotency_key")
        );
        assert_eq!(
            field(NewJob {
                uniqueness: crate::Uniqueness::WhileActive,
                ..NewJob::new("q")
            }),
            Some("uniqueness")
        );
        assert_eq!(
            field(NewJob::new("q").idempotency_key("k".repeat(513))),
            Some("idempotency_key")
        );
        assert_eq!(
            field(NewJob::new("q").payload(vec![0u8; 9])),
            Some("payload")
        );
        assert_eq!(field(NewJob::new("q").payload(vec![0u8; 8])), None);
        assert_eq!(
            field(NewJob::new("q").max_attempts(0)),
            Some("max_attempts")
        );
        assert_eq!(
            field(NewJob::new("q").concurrency_key("")),
            Some("concurrency_key")
        );
        assert_eq!(
            field(NewJob::new("q").concurrency_key("é".repeat(129))),
            Some("concurrency_key"),
            "258 bytes in 129 characters"
        );
        assert_eq!(
            field(NewJob::new("q").concurrency_key("k".repeat(256))),
            None
        );
    }

    #[test]
    fn claims_need_queues_and_a_sane_lease() {
        let ok = ClaimRequest::new(["a"], "w", Duration::from_secs(30));
        assert!(validate_claim(&ok).is_ok());
        assert!(validate_claim(&ok.clone().limit(0)).is_ok());
        let no_queues = ClaimRequest::new(Vec::<String>::new(), "w", Duration::from_secs(1));
        assert_eq!(
            validate_claim(&no_queues)
                .err()
                .and_then(|e| e.invalid_field()),
            Some("queues")
        );
        let zero_lease = ClaimRequest::new(["a"], "w", Duration::ZERO);
        assert_eq!(
            validate_claim(&zero_lease)
                .err()
                .and_then(|e| e.invalid_field()),
            Some("lease_ttl")
        );
        let no_worker = ClaimRequest::new(["a"], "", Duration::from_secs(1));
        assert_eq!(
            validate_claim(&no_worker)
                .err()
                .and_then(|e| e.invalid_field()),
            Some("worker")
        );
    }

    #[test]
    fn a_queue_named_twice_is_refused() {
        let twice = ClaimRequest::new(["a", "b", "a"], "w", Duration::from_secs(1));
        assert_eq!(
            validate_claim(&twice).err().and_then(|e| e.invalid_field()),
            Some("queues")
        );
        assert!(validate_queues(&["a".to_owned(), "b".to_owned()]).is_ok());
    }

    #[test]
    fn idempotency_keys_are_measured_in_bytes() {
        let settings = StoreSettings::default();
        let two_byte_chars = "é".repeat(257);
        assert_eq!(two_byte_chars.len(), 514);
        let job = NewJob::new("q").idempotency_key(two_byte_chars);
        assert_eq!(
            validate_new_job(&job, &settings)
                .err()
                .and_then(|e| e.invalid_field()),
            Some("idempotency_key")
        );
    }

    #[test]
    fn truncation_keeps_utf8_whole() {
        let long = "é".repeat(MAX_ERROR_BYTES);
        let cut = truncate_error(&long);
        assert!(cut.len() <= MAX_ERROR_BYTES);
        assert!(cut.chars().all(|c| c == 'é'));
    }
}
