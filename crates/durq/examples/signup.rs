//! An application's jobs, and their tests with the test kit.
//!
//! ```text
//! cargo run --example signup              # signs two people up and sends their welcomes
//! cargo test --example signup --features testing   # the tests at the bottom
//! ```
//!
//! Signing up enqueues a `Welcome`; the worker sends it, and a welcome to an address
//! without `@` is dead at once (retrying cannot fix it). The store is a SQLite file in
//! a temporary directory, deleted at the end.

use durq::{JobContext, JobError, JobOutcome, Store, TypedJob, Worker, WorkerBuilder};
use serde::{Deserialize, Serialize};

/// The job: a welcome email to send.
#[derive(Debug, Serialize, Deserialize)]
struct Welcome {
    to: String,
}

impl TypedJob for Welcome {
    const QUEUE: &'static str = "welcome";
    const MAX_ATTEMPTS: u32 = 5;

    /// One welcome per address while one is waiting or being sent.
    fn unique_key(&self) -> Option<String> {
        Some(self.to.clone())
    }
}

/// The application's code: signing up enqueues the welcome.
async fn sign_up(store: &Store, email: &str) -> durq::Result<()> {
    store
        .enqueue_typed(&Welcome {
            to: email.to_owned(),
        })
        .await?;
    Ok(())
}

/// The application's worker: the same builder in production and in tests.
fn workers(store: Store) -> WorkerBuilder {
    Worker::builder(store).typed_handler(|_ctx: JobContext, welcome: Welcome| async move {
        if !welcome.to.contains('@') {
            return Err(JobError::permanent(format!(
                "not an address: {}",
                welcome.to
            )));
        }
        println!("welcome sent to {}", welcome.to);
        Ok(())
    })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let url = format!("sqlite://{}", dir.path().join("signup.db").display());
    let store = durq::connect(&url).await?;
    sign_up(&store, "ada@example.com").await?;
    sign_up(&store, "grace").await?;

    let (finished, mut done) = tokio::sync::mpsc::unbounded_channel();
    let worker = workers(store.clone())
        .on_event(move |event| {
            if event.is_final() {
                let _ = finished.send(event.outcome().clone());
            }
        })
        .build()?;
    let running = worker.spawn();
    let mut outcomes = Vec::new();
    while outcomes.len() < 2 {
        match done.recv().await {
            Some(outcome) => outcomes.push(outcome),
            None => break,
        }
    }
    running.shutdown().await;
    let dead = outcomes
        .iter()
        .filter(|outcome| matches!(outcome, JobOutcome::Dead { .. }))
        .count();
    println!("{} welcomes ended, {dead} dead", outcomes.len());
    if outcomes.len() != 2 || dead != 1 {
        return Err(format!("expected two welcomes ended and one dead: {outcomes:?}").into());
    }
    Ok(())
}

#[cfg(all(test, feature = "testing"))]
mod tests {
    use durq::testing::TestKit;
    use durq::JobOutcome;

    use super::{sign_up, workers, Welcome};

    #[tokio::test]
    async fn signing_up_enqueues_a_welcome_that_is_sent() {
        let kit = TestKit::new();
        sign_up(&kit.store(), "ada@example.com")
            .await
            .expect("sign up");
        kit.assert_enqueued(|job: &Welcome| job.to == "ada@example.com")
            .await;
        let ran = kit
            .run_one(workers(kit.store()))
            .await
            .expect("a job was ready");
        assert!(matches!(ran.outcome(), JobOutcome::Succeeded), "{ran:?}");
    }

    #[tokio::test]
    async fn a_welcome_to_no_address_is_dead_at_once() {
        let kit = TestKit::new();
        sign_up(&kit.store(), "grace").await.expect("sign up");
        let ran = kit
            .run_one(workers(kit.store()))
            .await
            .expect("a job was ready");
        assert!(matches!(ran.outcome(), JobOutcome::Dead { .. }), "{ran:?}");
        kit.assert_not_enqueued::<Welcome, _>(|_| true).await;
    }

    #[tokio::test]
    async fn signing_up_twice_while_the_welcome_waits_enqueues_one() {
        let kit = TestKit::new();
        sign_up(&kit.store(), "ada@example.com")
            .await
            .expect("sign up");
        sign_up(&kit.store(), "ada@example.com")
            .await
            .expect("sign up again");
        let ran = kit.drain(workers(kit.store())).await;
        assert_eq!(ran.len(), 1, "{ran:?}");
    }
}
