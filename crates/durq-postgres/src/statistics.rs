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
//! size. After every [`LOOK_EVERY`] jobs it has claimed, it compares the table's pages
//! with the pages counted by the last `ANALYZE`. Once the table has grown
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

/// Jobs claimed between two looks at the table's size: one catalog read per this
/// many jobs.
pub(crate) const LOOK_EVERY: u64 = 1_000;

/// How much bigger than at its last `ANALYZE` the table must be to be analyzed again.
pub(crate) const GROWTH: i64 = 4;

/// The table size, in pages, below which the statistics do not matter: a few hundred
/// rows read whichever way the plan says.
const SMALL: i64 = 16;

/// Whether a table of `pages` pages now, last analyzed at `analyzed_pages` (0 when
/// never analyzed), has outgrown its statistics.
pub(crate) fn outgrown(analyzed_pages: i64, pages: i64) -> bool {
    pages >= SMALL && pages / GROWTH >= analyzed_pages.max(SMALL / GROWTH)
}

/// What one backend counts between looks.
#[derive(Debug, Default)]
pub(crate) struct TableGrowth {
    /// Jobs claimed since the last look.
    since_look: AtomicU64,
    /// Set while a look (and maybe an `ANALYZE`) runs, so at most one does at a time.
    looking: Arc<AtomicBool>,
}

impl TableGrowth {
    /// Counts `claimed` jobs; once [`LOOK_EVERY`] have been counted, looks at the
    /// table in a task of its own, off the caller's path.
    pub(crate) fn passed(&self, claimed: u64, pool: &PgPool, sql: &Arc<Statements>) {
        if claimed == 0 {
            return;
        }
        let before = self.since_look.fetch_add(claimed, Ordering::Relaxed);
        if before.saturating_add(claimed) < LOOK_EVERY {
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
        // A table never analyzed, once it matters.
        assert!(outgrown(0, SMALL));
        // After an ANALYZE at 100 pages: not at 399, at 400.
        assert!(!outgrown(100, 399));
        assert!(outgrown(100, 400));
        // A table that shrank, or stayed, is not.
        assert!(!outgrown(10_000, 5_000));
        assert!(!outgrown(i64::MAX, i64::MAX));
    }
}
