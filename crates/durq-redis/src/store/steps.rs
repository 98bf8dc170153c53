//! Durable steps (CONTRACT D1–D4): a step saved by a running job, fenced by its lease
//! token (`save_step.lua`); a job's generation and steps, read together (`steps.lua`);
//! and the reopen of an ended job from one of its steps (`reopen.lua`), which queues it
//! with retry's own moves (`requeue_ended.lua`).
//!
//! A job's steps are a hash of their own, `…:steps:ID` ([`crate::keys::Keys::steps`]),
//! beside the job's hash and in its slot; the generation is the job hash's `gen` field.
//! Each call is one script over those two keys, so it is atomic on a cluster too. On a
//! partitioned namespace the backend sends every call to the job's partition
//! (`RedisBackend::home`), whose keys these are.

use std::collections::HashMap;

use durq_core::steps::{self, SavedStep, StepLog, MAX_STEPS};
use durq_core::{Bytes, Error, JobId, LeaseToken, Result, Timestamp};
use redis::Value;

use super::{parse_state, status, RedisBackend};
use crate::codec::{into_opt_bytes, text};
use crate::scripts::{self, Eval};

impl RedisBackend {
    /// Rule D2: the job's generation and its steps in save order, read in one script
    /// (`steps.lua`), so a concurrent reopen is seen whole or not at all.
    pub(crate) async fn read_steps(&self, id: JobId) -> Result<StepLog> {
        let keys = self.keys();
        let mut invocation = scripts::STEPS.prepare_invoke();
        invocation.key(keys.job(id)).key(keys.steps(id));
        let reply = self.invoke(&invocation, "steps").await?;
        decode_steps(id, reply)
    }

    /// Rule D1: `save_step.lua` stores `output` as step `name` of the job running under
    /// `token`, unless a step of that name is stored already.
    pub(crate) async fn save_job_step(
        &self,
        id: JobId,
        token: LeaseToken,
        name: &str,
        output: Bytes,
        now: Timestamp,
    ) -> Result<()> {
        let keys = self.keys();
        // Built as the lease calls' hot scripts are (`Eval`): the output, which may be
        // as large as a payload, goes into the command's buffer as it is added, with no
        // vector of its own.
        let mut eval = Eval::new(&scripts::SAVE_STEP);
        eval.job_key(keys, id)
            .key(keys.steps(id))
            .arg(token.get())
            .arg(name)
            .arg(now.as_millis())
            .arg(output.as_ref())
            .arg(MAX_STEPS);
        let reply = self.eval(&eval, "save_step").await?;
        match status(&reply, "save_step reply")? {
            (word, _) if word == "ok" => Ok(()),
            (word, _) if word == "full" => Err(steps::too_many_steps()),
            (word, rest) => Err(Self::lease_call_error(id, &word, rest, "save_step reply")),
        }
    }

    /// Rule D3: `reopen.lua` reopens the ended job `id` from `step` if its generation is
    /// still `generation`, queueing it as [`RedisBackend::retry_job`] does.
    pub(crate) async fn reopen_job(
        &self,
        id: JobId,
        step: &str,
        generation: u64,
        now: Timestamp,
    ) -> Result<()> {
        let mut invocation = self.requeue_ended_call(&scripts::REOPEN, id, now);
        invocation
            .key(self.keys().steps(id))
            .arg(step)
            .arg(generation.to_string());
        let reply = self.invoke(&invocation, "retry_from").await?;
        const WHAT: &str = "retry_from reply";
        match status(&reply, WHAT)? {
            (word, _) if word == "ok" => Ok(()),
            (word, [state]) if word == "state" => Err(Error::InvalidState {
                id,
                state: parse_state(&text(state, WHAT)?, WHAT)?,
                operation: "retry_from",
            }),
            (word, [current]) if word == "stale" => Err(Error::StaleGeneration {
                id,
                expected: generation,
                current: parse_generation(id, &text(current, WHAT)?)?,
            }),
            (word, _) if word == "unsaved" => Err(steps::not_saved(step)),
            (word, rest) => Err(Self::lease_call_error(id, &word, rest, WHAT)),
        }
    }
}

/// A stored generation: the job hash's `gen` field, as `reopen.lua` writes it with
/// `HINCRBY` (`steps.lua` answers `0` for a job without one). Only the text HINCRBY
/// writes is one, at most 18 digits, as `reopen.lua` checks it: a reopen compares
/// generations as texts, so `01` read here as 1 could never be reopened.
fn parse_generation(id: JobId, text: &str) -> Result<u64> {
    let canonical = text == "0"
        || (text.len() <= 18
            && text.starts_with(|c: char| ('1'..='9').contains(&c))
            && text.bytes().all(|b| b.is_ascii_digit()));
    canonical
        .then(|| text.parse().ok())
        .flatten()
        .ok_or_else(|| {
            Error::corrupt(
                format!("job {id}"),
                format!("field gen not a generation: {text:?}"),
            )
        })
}

/// What one step's two fields held, as `HGETALL` hands them over in no given order.
#[derive(Default)]
struct Fields {
    /// `t:NAME`: the step's place in save order and when it was saved.
    placed: Option<(u64, i64)>,
    /// `o:NAME`: the output, as saved.
    output: Option<Bytes>,
}

/// `steps.lua`'s reply: `{'notfound'}`, or `{'ok', generation, HGETALL of the steps
/// hash}`. Takes the reply by value, so each output's bytes are moved, not copied: one
/// job's steps may hold up to [`MAX_STEPS`] outputs, each as large as a payload.
fn decode_steps(id: JobId, reply: Value) -> Result<StepLog> {
    const WHAT: &str = "steps reply";
    let Value::Array(items) = reply else {
        return Err(Error::corrupt(
            WHAT,
            format!("expected an array, got {reply:?}"),
        ));
    };
    let mut items = items.into_iter();
    let word = items
        .next()
        .ok_or_else(|| Error::corrupt(WHAT, "empty script reply"))?;
    let word = text(&word, WHAT)?;
    let (Some(generation), Some(Value::Array(flat)), None) =
        (items.next(), items.next(), items.next())
    else {
        let rest: Vec<Value> = items.collect();
        return Err(RedisBackend::lease_call_error(id, &word, &rest, WHAT));
    };
    if word != "ok" {
        return Err(RedisBackend::lease_call_error(id, &word, &[], WHAT));
    }
    let generation = parse_generation(id, &text(&generation, WHAT)?)?;
    let corrupt = |reason: String| Error::corrupt(format!("steps of job {id}"), reason);
    let mut by_name: HashMap<String, Fields> = HashMap::new();
    let mut flat = flat.into_iter();
    while let Some(field) = flat.next() {
        let value = flat
            .next()
            .ok_or_else(|| corrupt("a field without its value".to_owned()))?;
        let field = text(&field, WHAT)?;
        if let Some(name) = field.strip_prefix("t:") {
            let placed = text(&value, WHAT)
                .ok()
                .and_then(|placed| parse_placed(&placed))
                .ok_or_else(|| corrupt(format!("step {name:?}: unreadable place {value:?}")))?;
            by_name.entry(name.to_owned()).or_default().placed = Some(placed);
        } else if let Some(name) = field.strip_prefix("o:") {
            let output = into_opt_bytes(value)
                .ok_or_else(|| corrupt(format!("step {name:?}: output not bytes")))?;
            by_name.entry(name.to_owned()).or_default().output = Some(Bytes::from(output));
        }
        // `n`, the counter of places, says nothing a reader needs; any other field is
        // not this crate's and is left alone, as unknown fields of a job's hash are.
    }
    let mut placed = by_name
        .into_iter()
        .map(|(name, fields)| match fields {
            Fields {
                placed: Some((place, saved_at)),
                output: Some(output),
            } => Ok((
                place,
                SavedStep {
                    name,
                    output,
                    saved_at: Timestamp::from_millis(saved_at),
                },
            )),
            Fields { placed: None, .. } => Err(corrupt(format!("step {name:?}: no place"))),
            Fields { output: None, .. } => Err(corrupt(format!("step {name:?}: no output"))),
        })
        .collect::<Result<Vec<_>>>()?;
    placed.sort_unstable_by_key(|(place, _)| *place);
    Ok(StepLog {
        generation,
        steps: placed.into_iter().map(|(_, step)| step).collect(),
    })
}

/// A `t:NAME` value, `SEQ SAVED_AT`: the step's place in save order and its saved_at
/// in ms.
fn parse_placed(text: &str) -> Option<(u64, i64)> {
    let (place, saved_at) = text.split_once(' ')?;
    Some((place.parse().ok()?, saved_at.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    fn reply(generation: &str, flat: &[&str]) -> Value {
        Value::Array(vec![
            bulk("ok"),
            bulk(generation),
            Value::Array(flat.iter().map(|text| bulk(text)).collect()),
        ])
    }

    fn id() -> JobId {
        JobId::mint(Timestamp::from_millis(1_700_000_000_000))
    }

    #[test]
    fn steps_come_back_in_save_order_whatever_order_the_hash_gives() {
        let log = decode_steps(
            id(),
            reply(
                "3",
                &[
                    "o:b",
                    "two",
                    "t:b",
                    "12 200",
                    "n",
                    "12",
                    "t:a",
                    "9 100",
                    "o:a",
                    "",
                    "x:later",
                    "a field of a later version",
                ],
            ),
        )
        .expect("readable");
        assert_eq!(log.generation, 3);
        let names: Vec<&str> = log.steps.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(log.steps[0].output, Bytes::new());
        assert_eq!(log.steps[1].output, Bytes::from_static(b"two"));
        assert_eq!(log.steps[1].saved_at, Timestamp::from_millis(200));
    }

    #[test]
    fn an_unreadable_step_or_generation_is_corrupt_and_an_unknown_job_not_found() {
        for (generation, flat) in [
            ("x", &["t:a", "1 1", "o:a", ""][..]),
            ("0", &["t:a", "1 1"][..]),
            ("0", &["o:a", ""][..]),
            ("0", &["t:a", "one 1", "o:a", ""][..]),
            ("0", &["t:a"][..]),
            ("01", &[][..]),
            ("+1", &[][..]),
            ("1234567890123456789", &[][..]),
        ] {
            let err = decode_steps(id(), reply(generation, flat)).expect_err("unreadable");
            assert!(
                matches!(err, Error::Corrupt { .. }),
                "{generation} {flat:?}: {err}"
            );
        }
        let err = decode_steps(id(), Value::Array(vec![bulk("notfound")])).expect_err("unknown");
        assert!(matches!(err, Error::NotFound { .. }), "{err}");
    }
}
