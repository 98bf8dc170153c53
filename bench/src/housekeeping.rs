//! What a production PostgreSQL server does on its own while a queue drains, done by
//! the benchmark when the server it runs on does not: autovacuum.
//!
//! The PostgreSQL server of this machine runs with `autovacuum = off` (its CI
//! configuration), so nothing ever vacuums or analyzes the jobs table behind the
//! benchmark's back. A production server does both, and a job queue's table depends
//! on it more than most: every claim and completion leaves a dead row version and
//! dead index entries, and claims read the head of an index that the drain keeps
//! filling with them. Without statistics the planner also misjudges the table. So
//! where the server's autovacuum is off, this stands in for it, as a server tuned for
//! a queue table would run it (`autovacuum_naptime = 5s` and the per-table thresholds
//! the store's migration sets): `ANALYZE` once a backlog is in, and `VACUUM (ANALYZE)`
//! of the run's jobs table every 5 s while workers run. Where
//! autovacuum is on, it does nothing. Other backends need nothing of the kind.

/// How often the stand-in vacuums while workers run.
#[cfg(feature = "postgres")]
pub const VACUUM_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// The stand-in for one run; inert unless the run is on PostgreSQL with autovacuum off.
pub struct Housekeeping {
    #[cfg(feature = "postgres")]
    target: Option<(sqlx::PgPool, String)>,
}

impl Housekeeping {
    /// Does nothing, ever.
    pub fn none() -> Self {
        Housekeeping {
            #[cfg(feature = "postgres")]
            target: None,
        }
    }

    /// For the jobs table in `schema`, if the server at `url` has autovacuum off.
    #[cfg(feature = "postgres")]
    pub async fn postgres(url: &str, schema: &str) -> Result<Self, String> {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect(url)
            .await
            .map_err(|e| format!("housekeeping connect: {e}"))?;
        let autovacuum: String = sqlx::query_scalar("SELECT current_setting('autovacuum')")
            .fetch_one(&pool)
            .await
            .map_err(|e| format!("SHOW autovacuum: {e}"))?;
        if autovacuum == "on" {
            pool.close().await;
            return Ok(Housekeeping::none());
        }
        Ok(Housekeeping {
            target: Some((pool, format!("\"{schema}\".jobs"))),
        })
    }

    /// Who vacuums on this run, for the result line (a string: the result lines hold
    /// only strings and numbers).
    pub fn describe(&self) -> &'static str {
        #[cfg(feature = "postgres")]
        if self.target.is_some() {
            return "bench stand-in";
        }
        "server or none needed"
    }

    /// Closes its connection.
    pub async fn close(self) {
        #[cfg(feature = "postgres")]
        if let Some((pool, _)) = self.target {
            pool.close().await;
        }
    }

    /// Gathers statistics after a bulk load, as autovacuum's analyze would (not timed).
    pub async fn after_fill(&self) -> Result<(), String> {
        #[cfg(feature = "postgres")]
        if let Some((pool, table)) = &self.target {
            run(pool, &format!("ANALYZE {table}")).await?;
        }
        Ok(())
    }

    /// Vacuums every 5 s until the returned guard is dropped.
    pub fn while_draining(&self) -> VacuumLoop {
        #[cfg(feature = "postgres")]
        if let Some((pool, table)) = &self.target {
            let (pool, sql) = (pool.clone(), format!("VACUUM (ANALYZE) {table}"));
            return VacuumLoop(Some(tokio::spawn(async move {
                let mut ticker = tokio::time::interval(VACUUM_EVERY);
                // The first tick is immediate; the backlog was just analyzed.
                ticker.tick().await;
                loop {
                    ticker.tick().await;
                    if let Err(err) = run(&pool, &sql).await {
                        eprintln!("housekeeping: {err}");
                    }
                }
            })));
        }
        VacuumLoop(None)
    }
}

/// The vacuum loop of [`Housekeeping::while_draining`]; stops it when dropped.
pub struct VacuumLoop(Option<tokio::task::JoinHandle<()>>);

impl Drop for VacuumLoop {
    fn drop(&mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
        }
    }
}

#[cfg(feature = "postgres")]
async fn run(pool: &sqlx::PgPool, sql: &str) -> Result<(), String> {
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(pool)
        .await
        .map(|_| ())
        .map_err(|e| format!("{sql}: {e}"))
}
