//! `durq retry` and `durq cancel`: of jobs named by id, or of every job a filter
//! selects, with a dry run, a confirmation, a progress bar and a final count.
//!
//! The jobs are chosen first, and all of them checked, before any is touched: every
//! id must name a job the action applies to, and a filter's pages are read to the
//! end. Then each is acted on; one that changed meanwhile (retried, finished or
//! deleted by someone else) is skipped and counted, and any other failure stops the
//! command with how far it got.

use durq::{Error, JobId, JobState};
use serde::Serialize;

use crate::cli::{Action, Selection};
use crate::commands::read::every_job;
use crate::error::CliError;
use crate::{Context, Result};

/// The jobs selected, and how.
struct Chosen {
    ids: Vec<JobId>,
    /// The filter that selected them; `None` for ids.
    filter: Option<(JobState, String)>,
}

impl Chosen {
    /// `n` of these jobs, in words: `2 dead jobs of queue emails`, `1 job`.
    fn describe(&self, n: usize) -> String {
        let jobs = if n == 1 { "job" } else { "jobs" };
        match &self.filter {
            Some((state, queue)) => format!("{n} {state} {jobs} of queue {queue}"),
            None => format!("{n} {jobs}"),
        }
    }
}

/// `durq retry …` and `durq cancel …`.
pub async fn act(cx: &mut Context<'_>, action: Action, selection: &Selection) -> Result<()> {
    let chosen = choose(cx, action, selection).await?;
    let count = chosen.ids.len();
    if selection.dry_run {
        return report(cx, action, &chosen, true, None);
    }
    if count == 0 {
        return report(cx, action, &chosen, false, Some(Tally::default()));
    }
    if chosen.filter.is_some() && !selection.yes {
        confirm(cx, action, &chosen.describe(count))?;
    }
    let tally = apply(cx, action, &chosen.ids).await?;
    report(cx, action, &chosen, false, Some(tally))
}

/// The ids the selection names, each checked, or every job its filter selects.
async fn choose(cx: &Context<'_>, action: Action, selection: &Selection) -> Result<Chosen> {
    if let (Some(queue), Some(state)) = (&selection.queue, selection.state) {
        let state = JobState::from(state);
        if !action.applies_to(state) {
            return Err(CliError::new(format!(
                "`durq {}` acts on {} jobs, not {state} ones",
                action.verb(),
                action.states_text()
            )));
        }
        let jobs = every_job(cx, queue, state).await?;
        return Ok(Chosen {
            ids: jobs.into_iter().map(|job| job.id).collect(),
            filter: Some((state, queue.clone())),
        });
    }
    let mut ids = Vec::with_capacity(selection.ids.len());
    for &id in &selection.ids {
        if ids.contains(&id) {
            continue;
        }
        let job = cx.store.get(id).await?;
        if !action.applies_to(job.state) {
            return Err(CliError::new(format!(
                "cannot {} job {id}: it is {}, and only {} jobs can be{}",
                action.verb(),
                job.state,
                action.states_text(),
                match action {
                    Action::Retry => " retried",
                    Action::Cancel => " cancelled",
                }
            )));
        }
        ids.push(id);
    }
    Ok(Chosen { ids, filter: None })
}

/// Asks before acting on what a filter selected; refuses where nobody can answer.
fn confirm(cx: &mut Context<'_>, action: Action, jobs: &str) -> Result<()> {
    let verb = action.verb();
    if !cx.terminal.can_ask() {
        return Err(CliError::new(format!(
            "refusing to {verb} {jobs} without confirmation: pass --yes to {verb} them, \
             or --dry-run to list them"
        )));
    }
    let question = format!("{} {jobs}?", capitalized(verb));
    if cx.terminal.confirm(&question)? {
        Ok(())
    } else {
        Err(CliError::new(format!(
            "not confirmed: no job was {}",
            past(action)
        )))
    }
}

/// What acting did.
#[derive(Debug, Default, Clone, Copy, Serialize)]
struct Tally {
    /// Retried, or cancelled.
    done: u64,
    /// Running jobs asked to stop (cancel only).
    stop_requested: u64,
    /// Jobs that had changed since they were chosen.
    skipped: u64,
}

async fn apply(cx: &mut Context<'_>, action: Action, ids: &[JobId]) -> Result<Tally> {
    let bar = cx.terminal.progress(ids.len() as u64);
    bar.set_message(match action {
        Action::Retry => "retrying",
        Action::Cancel => "cancelling",
    });
    let mut tally = Tally::default();
    for &id in ids {
        let outcome = match action {
            Action::Retry => cx.store.retry(id).await.map(|()| JobState::Queued),
            Action::Cancel => cx.store.cancel(id).await,
        };
        match outcome {
            Ok(JobState::Queued) if action == Action::Retry => tally.done += 1,
            Ok(JobState::Cancelled) if action == Action::Cancel => tally.done += 1,
            Ok(JobState::Running) if action == Action::Cancel => tally.stop_requested += 1,
            // Finished (or changed) since it was chosen.
            Ok(_) | Err(Error::NotFound { .. } | Error::InvalidState { .. }) => {
                tally.skipped += 1;
            }
            Err(err) => {
                bar.finish_and_clear();
                let err = CliError::from(err);
                return Err(CliError::new(format!(
                    "{} {} of {} jobs, then job {id} failed: {}",
                    past(action),
                    tally.done + tally.stop_requested,
                    ids.len(),
                    err.message()
                )));
            }
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(tally)
}

fn report(
    cx: &mut Context<'_>,
    action: Action,
    chosen: &Chosen,
    dry_run: bool,
    tally: Option<Tally>,
) -> Result<()> {
    let count = chosen.ids.len();
    if cx.json {
        #[derive(Serialize)]
        struct Doc<'a> {
            action: &'static str,
            dry_run: bool,
            count: usize,
            ids: &'a [JobId],
            #[serde(flatten)]
            tally: Option<Tally>,
        }
        return cx.print_json(&Doc {
            action: action.verb(),
            dry_run,
            count,
            ids: &chosen.ids,
            tally,
        });
    }
    if count == 0 {
        let none = match &chosen.filter {
            Some((state, queue)) => format!("no {state} jobs of queue {queue}"),
            None => "no jobs".to_owned(),
        };
        return cx.print(&format!("{none} to {}\n", action.verb()));
    }
    let Some(tally) = tally else {
        let mut text = format!("would {} {}:\n", action.verb(), chosen.describe(count));
        for id in &chosen.ids {
            text.push_str(&format!("{id}\n"));
        }
        return cx.print(&text);
    };
    let mut parts = Vec::new();
    if tally.done > 0 || tally.stop_requested == 0 {
        parts.push(format!("{} {}", past(action), counted(tally.done, "job")));
    }
    if tally.stop_requested > 0 {
        parts.push(format!(
            "asked {} to stop",
            counted(tally.stop_requested, "running job")
        ));
    }
    if tally.skipped > 0 {
        parts.push(format!(
            "skipped {} that changed meanwhile",
            counted(tally.skipped, "job")
        ));
    }
    cx.print(&format!("{}\n", parts.join("; ")))
}

fn past(action: Action) -> &'static str {
    match action {
        Action::Retry => "retried",
        Action::Cancel => "cancelled",
    }
}

/// `1 job`, `2 jobs`.
fn counted(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

fn capitalized(word: &str) -> String {
    let mut chars = word.chars();
    chars
        .next()
        .map(|first| first.to_uppercase().chain(chars).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use durq::worker_calls::{ClaimRequest, Retry};
    use durq::{NewJob, Store};
    use indicatif::ProgressBar;

    use super::*;
    use crate::cli::StateArg;
    use crate::Terminal;

    /// A person at a terminal who answers every question with `answer`.
    struct Person {
        answer: bool,
        asked: Vec<String>,
    }

    impl Terminal for Person {
        fn stdin_is_terminal(&self) -> bool {
            true
        }
        fn read_stdin(&mut self) -> std::io::Result<Vec<u8>> {
            Ok(Vec::new())
        }
        fn can_ask(&self) -> bool {
            true
        }
        fn confirm(&mut self, question: &str) -> std::io::Result<bool> {
            self.asked.push(question.to_owned());
            Ok(self.answer)
        }
        fn progress(&self, len: u64) -> ProgressBar {
            let bar = ProgressBar::hidden();
            bar.set_length(len);
            bar
        }
        fn warn(&mut self, _: &str) {}
        fn note(&mut self, _: &str) {}
    }

    async fn dead_job(store: &Store) -> JobId {
        let id = store.enqueue(NewJob::new("q")).await.expect("enqueue").id;
        let request = ClaimRequest::new(["q"], "w", Duration::from_secs(60)).reserved(id);
        let claimed = store.claim(request).await.expect("claim").remove(0);
        store
            .fail(id, claimed.token(), "boom", Retry::Never)
            .await
            .expect("fail");
        id
    }

    fn by_filter(yes: bool) -> Selection {
        Selection {
            ids: Vec::new(),
            queue: Some("q".into()),
            state: Some(StateArg::Dead),
            dry_run: false,
            yes,
        }
    }

    async fn retry(store: &Store, person: &mut Person, selection: &Selection) -> Result<String> {
        let mut out = Vec::new();
        let mut cx = Context {
            store,
            out: &mut out,
            json: false,
            terminal: person,
        };
        act(&mut cx, Action::Retry, selection).await?;
        Ok(String::from_utf8(out).expect("utf-8"))
    }

    #[tokio::test]
    async fn a_filter_asks_first_and_acts_only_on_yes() {
        let store = durq::connect("memory://").await.expect("store");
        let (a, b) = (dead_job(&store).await, dead_job(&store).await);
        let mut no = Person {
            answer: false,
            asked: Vec::new(),
        };
        let err = retry(&store, &mut no, &by_filter(false))
            .await
            .expect_err("declined");
        assert_eq!(err.message(), "not confirmed: no job was retried");
        assert_eq!(no.asked, ["Retry 2 dead jobs of queue q?"]);
        for id in [a, b] {
            assert_eq!(store.get(id).await.expect("get").state, JobState::Dead);
        }
        let mut yes = Person {
            answer: true,
            asked: Vec::new(),
        };
        let out = retry(&store, &mut yes, &by_filter(false))
            .await
            .expect("retried");
        assert_eq!(out, "retried 2 jobs\n");
        assert_eq!(yes.asked.len(), 1);
        for id in [a, b] {
            assert_eq!(store.get(id).await.expect("get").state, JobState::Queued);
        }
    }

    #[tokio::test]
    async fn yes_and_ids_ask_nothing() {
        let store = durq::connect("memory://").await.expect("store");
        let id = dead_job(&store).await;
        let mut person = Person {
            answer: false,
            asked: Vec::new(),
        };
        let ids = Selection {
            ids: vec![id, id],
            queue: None,
            state: None,
            dry_run: false,
            yes: false,
        };
        let out = retry(&store, &mut person, &ids).await.expect("by id");
        assert_eq!(out, "retried 1 job\n", "an id named twice is retried once");
        dead_job(&store).await;
        let out = retry(&store, &mut person, &by_filter(true))
            .await
            .expect("--yes");
        assert_eq!(out, "retried 1 job\n");
        assert!(person.asked.is_empty(), "{:?}", person.asked);
    }
}
