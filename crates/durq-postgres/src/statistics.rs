//! Planner statistics that keep up with a job table as it grows.
//!
//! Each connection prepares the hot-path statements once, and after five runs
//! PostgreSQL settles on a generic plan that it keeps until the table's statistics
//! change. A plan made while the table was small reads the namespace through an index
//! on `namespace` alone. For a dozen rows that is the cheapest plan; at a hundred
//! thousand it is the worst. In the benchmark with a producer, the completion batches
//! read every row of the namespace through `jobs_listing`: 14 million index entries
//! for 50,000 jobs, at half the speed of a run whose plans came later. Autovacuum
//! refreshes the statistics, but only after its nap (a minute by default), and a burst
//! can begin and end inside one nap.
//!
//! So the backend whose plans suffer, the one that claims, also watches the table's
//! size. After [`FIRST_LOOK`] jobs it has claimed, then after twice as many again each
//! time up to every [`LOOK_EVERY`], it compares the table's pages with the pages
//! counted by the last `ANALYZE`. The first looks come early because a namespace is
//! young for its first thousand jobs too: looking only every thousand, a fresh table's
//! first `ANALYZE` came after about a thousand jobs, and until then every claim's
//! lease read the whole namespace through `jobs_pkey` (800 buffers a claim of one job
//! by the end, against 22 once analyzed), which put PostgreSQL's pickup p99 at 0.6 of
//! the pinned baseline's. Once the table has grown
//! [`GROWTH`]-fold, it runs `ANALYZE` on the job table. A process that only enqueues
//! never does: its statement's plan does not depend on the table's size, and counting
//! on the producer's side cost a batch enqueue of 10,000 jobs three `ANALYZE`s in a
//! tenth of a second. New statistics invalidate the cached plans of every
//! session, and each session then plans again from the new figures. Growth is
//! geometric, so this happens a handful of times over a table's life. A table that
//! stops growing is left to autovacuum.
//!
//! One case stays open. A new namespace in a large table shared with other namespaces
//! does not grow the table. Its plans follow autovacuum, as they did before.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use sqlx::PgPool;

use crate::sql::Statements;

/// Jobs claimed between two looks at the table's size, once the first looks are
/// past: one catalog read per this many jobs.
pub(crate) const LOOK_EVERY: u64 = 1_000;

/// Jobs claimed before the first look. The wait doubles after each look until it is
/// [`LOOK_EVERY`]: five catalog reads more in a backend's life (after 16, 48, 112,
/// 240 and 496 jobs, then after 1,008 and every 1,000 more), so a young table is
/// analyzed soon after it reaches [`SMALL`] pages.
pub(crate) const FIRST_LOOK: u64 = 16;

/// How much bigger than at its last `ANALYZE` the table must be to be analyzed again.
pub(crate) const GROWTH: i64 = 4;

/// The table size, in pages, below which the statistics do not matter: a few dozen
/// rows, read whichever way the plan says. At 16 pages they did: a table that size
/// holds a few hundred row versions, and a claim whose lease read them all took 0.3 ms
/// more than one that read its own rows. An `ANALYZE` of a table this small takes
/// about a millisecond, and with geometric growth it is one `ANALYZE` more in a
/// table's life.
const SMALL: i64 = 4;

/// Whether a table of `pages` pages now, last analyzed at `analyzed_pages` (0 when
/// never analyzed), has outgrown its statistics.
pub(crate) fn outgrown(analyzed_pages: i64, pages: i64) -> bool {
    pages >= SMALL && pages / GROWTH >= analyzed_pages.max(SMALL / GROWTH)
}

/// The jobs the look after one that waited `wait` jobs waits for.
fn wait_after(wait: u64) -> u64 {
    wait.saturating_mul(2).min(LOOK_EVERY)
}

/// What one backend counts between looks.
#[derive(Debug)]
pub(crate) struct TableGrowth {
    /// Jobs claimed since the last look.
    since_look: AtomicU64,
    /// Jobs to claim before the next look: [`FIRST_LOOK`], doubled after each look up
    /// to [`LOOK_EVERY`].
    next_look: AtomicU64,
    /// Set while a look (and maybe an `ANALYZE`) runs, so at most one does at a time.
    looking: Arc<AtomicBool>,
}

impl Default for TableGrowth {
    fn default() -> Self {
        TableGrowth {
            since_look: AtomicU64::new(0),
            next_look: AtomicU64::new(FIRST_LOOK),
            looking: Arc::default(),
        }
    }
}

impl TableGrowth {
    /// Counts `claimed` jobs; once as many as the next look waits for have been
    /// counted, looks at the table in a task of its own, off the caller's path.
    pub(crate) fn passed(&self, claimed: u64, pool: &PgPool, sql: &Arc<Statements>) {
        if claimed == 0 {
            return;
        }
        let before = self.since_look.fetch_add(claimed, Ordering::Relaxed);
        let wait = self.next_look.load(Ordering::Relaxed);
        if before.saturating_add(claimed) < wait {
            return;
        }
        if self.looking.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.looking.store(false, Ordering::Release);
            return;
        };
        self.since_look.store(0, Ordering::Relaxed);
        self.next_look.store(wait_after(wait), Ordering::Relaxed);
        let (pool, sql, looking) = (pool.clone(), Arc::clone(sql), Arc::clone(&self.looking));
        runtime.spawn(async move {
            if let Err(err) = look(&pool, &sql).await {
                // Statistics only speed plans up: a failed look costs nothing but time,
                // and the next one comes after as many jobs again.
                tracing::debug!(error = %err, "job table statistics not refreshed");
            }
            looking.store(false, Ordering::Release);
        });
    }
}

/// Looks at the job table's size and analyzes it when it has outgrown its statistics.
/// Answers whether it ran `ANALYZE`.
pub(crate) async fn look(pool: &PgPool, sql: &Statements) -> Result<bool, sqlx::Error> {
    let (analyzed_pages, pages): (i64, i64) =
        sqlx::query_as(sql.table_size.sql()).fetch_one(pool).await?;
    if !outgrown(analyzed_pages, pages) {
        return Ok(false);
    }
    tracing::debug!(
        analyzed_pages,
        pages,
        "job table outgrew its statistics; analyzing"
    );
    sqlx::raw_sql(sql.analyze_jobs.sql()).execute(pool).await?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_is_analyzed_each_time_it_has_grown_fourfold() {
        // Small tables are left alone, analyzed or not.
        assert!(!outgrown(0, 0));
        assert!(!outgrown(0, SMALL - 1));
        // A table never analyzed, once it matters: at 4 pages, a few dozen rows.
        assert!(outgrown(0, SMALL));
        assert!(outgrown(0, 4));
        // After an ANALYZE at 4 pages: at 16.
        assert!(!outgrown(4, 15));
        assert!(outgrown(4, 16));
        // After an ANALYZE at 100 pages: not at 399, at 400.
        assert!(!outgrown(100, 399));
        assert!(outgrown(100, 400));
        // A table that shrank, or stayed, is not.
        assert!(!outgrown(10_000, 5_000));
        assert!(!outgrown(i64::MAX, i64::MAX));
    }

    #[test]
    fn the_first_looks_come_early_and_then_every_thousand_jobs() {
        let mut wait = TableGrowth::default().next_look.load(Ordering::Relaxed);
        let mut looks = Vec::new();
        let mut claimed = 0;
        while claimed < 3_000 {
            claimed += wait;
            looks.push(claimed);
            wait = wait_after(wait);
        }
        assert_eq!(looks, [16, 48, 112, 240, 496, 1_008, 2_008, 3_008]);
    }
}
