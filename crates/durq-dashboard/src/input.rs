//! Every input the dashboard takes, parsed and checked before the store is called: a
//! query string or form body (known fields only, each at most once unless it is one
//! that repeats), job ids, queue names and prefixes, states, tenants, tag filters,
//! page sizes.

use durq::{JobId, JobState, ListQuery, Tags};

use crate::problem::Problem;

/// The largest page of a job list.
pub(crate) const MAX_PAGE: usize = durq_core::validate::MAX_LIST_LIMIT;

/// The page size of a job list when none is asked for.
pub(crate) const DEFAULT_PAGE: usize = 50;

/// The fields of a query string or an urlencoded form.
#[derive(Debug, Default)]
pub(crate) struct Params {
    fields: Vec<(String, String)>,
}

impl Params {
    /// Parses `raw` (`a=1&b=2`), refusing a field not in `allowed` and a field given
    /// twice.
    pub fn parse(raw: &[u8], allowed: &[&str]) -> Result<Params, Problem> {
        Params::parse_repeating(raw, allowed, &[])
    }

    /// Parses `raw` as [`parse`](Params::parse) does, and also takes the fields in
    /// `repeating` (`state=a&state=b`) any number of times.
    pub fn parse_repeating(
        raw: &[u8],
        allowed: &[&str],
        repeating: &[&str],
    ) -> Result<Params, Problem> {
        let mut fields: Vec<(String, String)> = Vec::new();
        for (key, value) in url::form_urlencoded::parse(raw) {
            let repeats = repeating.contains(&key.as_ref());
            if !repeats && !allowed.contains(&key.as_ref()) {
                return Err(Problem::bad_request(format!(
                    "unknown parameter {:?}",
                    cut(&key)
                )));
            }
            if !repeats && fields.iter().any(|(k, _)| *k == key) {
                return Err(Problem::bad_request(format!(
                    "parameter {key:?} given more than once"
                )));
            }
            fields.push((key.into_owned(), value.into_owned()));
        }
        Ok(Params { fields })
    }

    /// Parses an optional query string.
    pub fn query(raw: Option<&str>, allowed: &[&str]) -> Result<Params, Problem> {
        Params::parse(raw.unwrap_or("").as_bytes(), allowed)
    }

    /// Parses an optional query string whose fields in `repeating` may repeat.
    pub fn query_repeating(
        raw: Option<&str>,
        allowed: &[&str],
        repeating: &[&str],
    ) -> Result<Params, Problem> {
        Params::parse_repeating(raw.unwrap_or("").as_bytes(), allowed, repeating)
    }

    /// Every value given for `key`, in order, the empty ones left out.
    pub fn all<'a>(&'a self, key: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.fields
            .iter()
            .filter(move |(k, v)| k == key && !v.is_empty())
            .map(|(_, v)| v.as_str())
    }

    /// The value of `key`, if given and not empty.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, v)| k == key && !v.is_empty())
            .map(|(_, v)| v.as_str())
    }

    /// The value of `key`, refused when missing.
    pub fn require(&self, key: &str) -> Result<&str, Problem> {
        self.get(key)
            .ok_or_else(|| Problem::bad_request(format!("parameter {key:?} is missing")))
    }
}

/// A job id in its canonical text.
pub(crate) fn job_id(text: &str) -> Result<JobId, Problem> {
    text.parse::<JobId>()
        .map_err(|err| Problem::bad_request(format!("{err}: {:?}", cut(text))))
}

/// A queue name, checked as the store checks it.
pub(crate) fn queue(text: &str) -> Result<String, Problem> {
    durq_core::validate::validate_queue(text)
        .map_err(|err| Problem::bad_request(format!("{err}: {:?}", cut(text))))?;
    Ok(text.to_owned())
}

/// The limits of the limits form: each field empty or absent for none, a count of at
/// least 1, a rate as `STARTS/PERIOD`, `fair_shares` present for fair shares; checked
/// as the store checks them (CONTRACT K3, K4).
pub(crate) fn limits(form: &Params) -> Result<durq::QueueLimits, Problem> {
    let given = |field: &str| {
        form.get(field)
            .map(str::trim)
            .filter(|text| !text.is_empty())
    };
    let count = |field: &str| -> Result<Option<u32>, Problem> {
        given(field)
            .map(|text| {
                text.parse::<u32>().map_err(|_| {
                    Problem::bad_request(format!("{field} must be a whole number: {:?}", cut(text)))
                })
            })
            .transpose()
    };
    let rate = |field: &str| -> Result<Option<durq::Rate>, Problem> {
        given(field)
            .map(|text| {
                text.parse::<durq::Rate>()
                    .map_err(|err| Problem::bad_request(format!("{field}: {err}")))
            })
            .transpose()
    };
    let mut limits = durq::QueueLimits::new();
    limits.max_running = count("max_running")?;
    limits.max_running_per_key = count("max_running_per_key")?;
    limits.max_starts = rate("max_starts")?;
    limits.max_starts_per_key = rate("max_starts_per_key")?;
    limits.fair_shares = form.get("fair_shares").is_some();
    limits
        .validate()
        .map_err(|err| Problem::bad_request(err.to_string()))?;
    Ok(limits)
}

/// A queue-name prefix, checked as the store checks the prefix of a list (CONTRACT
/// A4: a byte no queue name may hold is refused, not matched to nothing).
pub(crate) fn queue_prefix(text: &str) -> Result<String, Problem> {
    list_check(&ListQuery::all().queue_prefix(text), text)?;
    Ok(text.to_owned())
}

/// A tenant, checked as the store checks the tenant of a list.
pub(crate) fn tenant(text: &str) -> Result<String, Problem> {
    list_check(&ListQuery::all().tenant(text), text)?;
    Ok(text.to_owned())
}

/// A tag filter `key=value` (split at the first `=`; the value may be empty), checked
/// as the store checks a job's tags (CONTRACT E11).
pub(crate) fn tag(text: &str) -> Result<(String, String), Problem> {
    let Some((key, value)) = text.split_once('=') else {
        return Err(Problem::bad_request(format!(
            "a tag filter is key=value, not {:?}",
            cut(text)
        )));
    };
    let tags = Tags::from([(key.to_owned(), value.to_owned())]);
    durq_core::meta::validate_tags("tag", &tags)
        .map_err(|err| Problem::bad_request(format!("{err}: {:?}", cut(text))))?;
    Ok((key.to_owned(), value.to_owned()))
}

/// A whole list query, as the store checks it before any backend sees it: what each
/// field passed alone may still fail together (more tags than a job may carry).
pub(crate) fn list_query(query: &ListQuery) -> Result<(), Problem> {
    durq_core::validate::validate_list(query).map_err(|err| Problem::bad_request(err.to_string()))
}

fn list_check(query: &ListQuery, text: &str) -> Result<(), Problem> {
    durq_core::validate::validate_list(query)
        .map_err(|err| Problem::bad_request(format!("{err}: {:?}", cut(text))))
}

/// A job state by its stored name (`queued`, `running`, `succeeded`, `dead`,
/// `cancelled`).
pub(crate) fn state(text: &str) -> Result<JobState, Problem> {
    text.parse::<JobState>()
        .map_err(|_| Problem::bad_request(format!("unknown state {:?}", cut(text))))
}

/// A page size: 1..=[`MAX_PAGE`].
pub(crate) fn page_size(text: &str) -> Result<usize, Problem> {
    match text.parse::<usize>() {
        Ok(n) if (1..=MAX_PAGE).contains(&n) => Ok(n),
        _ => Err(Problem::bad_request(format!(
            "limit must be a number from 1 to {MAX_PAGE}, not {:?}",
            cut(text)
        ))),
    }
}

/// At most 64 characters of what the user sent, for an error message.
fn cut(text: &str) -> String {
    text.chars().take(64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_refuse_unknown_and_repeated_fields() {
        let ok = Params::parse(b"queue=a&state=dead&limit=", &["queue", "state", "limit"])
            .expect("known fields");
        assert_eq!(ok.get("queue"), Some("a"));
        assert_eq!(ok.get("limit"), None, "an empty value is no value");
        assert!(ok.require("limit").is_err());
        assert!(Params::parse(b"queue=a&queue=b", &["queue"]).is_err());
        assert!(Params::parse(b"bogus=1", &["queue"]).is_err());
        assert!(Params::query(None, &[]).is_ok());
        let many = Params::parse_repeating(b"state=a&state=&state=b&q=1", &["q"], &["state"])
            .expect("a repeating field");
        assert_eq!(many.all("state").collect::<Vec<_>>(), ["a", "b"]);
        assert!(Params::parse_repeating(b"q=1&q=2", &["q"], &["state"]).is_err());
        assert!(Params::parse_repeating(b"x=1", &["q"], &["state"]).is_err());
    }

    #[test]
    fn values_are_checked_as_the_store_checks_them() {
        let id = JobId::mint(durq::Timestamp::from_millis(1_700_000_000_000));
        assert_eq!(job_id(&id.to_string()).ok(), Some(id));
        assert!(job_id("nope").is_err());
        assert!(job_id("00000000-0000-4000-8000-000000000000").is_err());
        assert!(queue("emails.v2:high").is_ok());
        assert!(queue("no spaces").is_err());
        assert!(queue(&"q".repeat(129)).is_err());
        assert!(queue("").is_err());
        assert_eq!(state("dead").ok(), Some(JobState::Dead));
        assert!(state("Dead").is_err());
        assert_eq!(page_size("1000").ok(), Some(1000));
        assert!(page_size("0").is_err());
        assert!(page_size("1001").is_err());
        assert!(page_size("-1").is_err());
        assert_eq!(queue_prefix("emails.").ok().as_deref(), Some("emails."));
        assert!(queue_prefix("e*").is_err());
        assert!(queue_prefix(&"p".repeat(129)).is_err());
        assert!(tenant(&"t".repeat(256)).is_ok());
        assert!(tenant(&"t".repeat(257)).is_err());
        assert_eq!(
            tag("customer=42=x").ok(),
            Some(("customer".into(), "42=x".into()))
        );
        assert_eq!(tag("flag=").ok(), Some(("flag".into(), String::new())));
        assert!(tag("no-equals").is_err());
        assert!(tag("=v").is_err());
        assert!(tag("a b=v").is_err());
        assert!(tag("k=line\nbreak").is_err());
        assert!(tag(&format!("k={}", "v".repeat(257))).is_err());
        let crowded = (0..17).fold(ListQuery::all(), |q, i| q.tag(format!("k{i}"), ""));
        assert!(list_query(&crowded).is_err());
        assert!(list_query(&ListQuery::all()).is_ok());
    }
}
