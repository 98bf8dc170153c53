//! Embedded, versioned migrations, applied under an advisory lock.

use std::hash::Hasher;

use durq_core::{Error, Result};
use sqlx::{AssertSqlSafe, PgPool, Row};

use crate::error::map;

/// One step of the schema, applied once per database schema, in version order.
struct Migration {
    version: i32,
    name: &'static str,
    sql: &'static str,
}

/// Every migration, oldest first. A new one is appended with the next version; an
/// applied one is never edited.
const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "init",
        sql: include_str!("../migrations/0001_init.sql"),
    },
    Migration {
        version: 2,
        name: "pk_lookups",
        sql: include_str!("../migrations/0002_pk_lookups.sql"),
    },
    Migration {
        version: 3,
        name: "timeout",
        sql: include_str!("../migrations/0003_timeout.sql"),
    },
    Migration {
        version: 4,
        name: "paused_queues",
        sql: include_str!("../migrations/0004_paused.sql"),
    },
    Migration {
        version: 5,
        name: "unique_while_active",
        sql: include_str!("../migrations/0005_unique_while_active.sql"),
    },
    Migration {
        version: 6,
        name: "schedules",
        sql: include_str!("../migrations/0006_schedules.sql"),
    },
    Migration {
        version: 7,
        name: "fit",
        sql: include_str!("../migrations/0007_fit.sql"),
    },
    Migration {
        version: 8,
        name: "fence",
        sql: include_str!("../migrations/0008_fence.sql"),
    },
    Migration {
        version: 9,
        name: "workers",
        sql: include_str!("../migrations/0009_workers.sql"),
    },
    Migration {
        version: 10,
        name: "attempts_tags",
        sql: include_str!("../migrations/0010_attempts_tags.sql"),
    },
    Migration {
        version: 11,
        name: "flow_control",
        sql: include_str!("../migrations/0011_flow_control.sql"),
    },
    Migration {
        version: 12,
        name: "dependencies",
        sql: include_str!("../migrations/0012_dependencies.sql"),
    },
    Migration {
        version: 13,
        name: "awaited",
        sql: include_str!("../migrations/0013_awaited.sql"),
    },
    Migration {
        version: 14,
        name: "steps",
        sql: include_str!("../migrations/0014_steps.sql"),
    },
    Migration {
        version: 15,
        name: "events",
        sql: include_str!("../migrations/0015_events.sql"),
    },
];

/// The newest schema version this build knows.
pub(crate) fn latest_version() -> i32 {
    MIGRATIONS.last().map_or(0, |m| m.version)
}

/// The advisory lock key of `schema`'s migrations: the 64-bit FNV-1a hash of a fixed
/// prefix and the schema name, so two schemas in one database migrate independently.
///
/// FNV-1a is a fixed function, unlike std's and rustc-hash's hashers, which may change
/// between releases: every build of this crate takes the same key for a schema (the
/// one it took before this hash came from the `fnv` crate), so processes of different
/// versions migrating one schema at once still queue on one lock.
pub(crate) fn lock_key(schema: &str) -> i64 {
    let mut hasher = fnv::FnvHasher::default();
    // `write`, not `Hash::hash`: a str's `Hash` appends a terminator byte, which would
    // change the key.
    hasher.write(b"jobs-postgres/migrate/");
    hasher.write(schema.as_bytes());
    i64::from_ne_bytes(hasher.finish().to_ne_bytes())
}

/// Brings `schema` to the latest version.
///
/// A schema already at the latest version costs two reads and takes no lock, so an
/// application role without DDL rights can open a migrated database. Otherwise one
/// transaction takes `pg_advisory_xact_lock` for the schema, creates the schema and the
/// migrations table if missing, and applies each missing migration with its record;
/// processes migrating at once queue on the lock, and each finds the work done by the
/// one before it. A database migrated by a newer build is accepted: migrations only add.
pub(crate) async fn migrate(pool: &PgPool, schema: &str, quoted: &str) -> Result<()> {
    let latest = latest_version();
    if current_version(pool, quoted).await? >= latest {
        return Ok(());
    }
    let mut tx = pool
        .begin()
        .await
        .map_err(|err| map("migrate: begin", err))?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(lock_key(schema))
        .execute(&mut *tx)
        .await
        .map_err(|err| map("migrate: advisory lock", err))?;
    let bootstrap = format!(
        "CREATE SCHEMA IF NOT EXISTS {quoted};
         CREATE TABLE IF NOT EXISTS {quoted}.migrations (
             version    integer     PRIMARY KEY,
             name       text        NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now()
         );"
    );
    sqlx::raw_sql(AssertSqlSafe(bootstrap))
        .execute(&mut *tx)
        .await
        .map_err(|err| map("migrate: create schema", err))?;
    let applied: i32 = sqlx::query(AssertSqlSafe(format!(
        "SELECT coalesce(max(version), 0) FROM {quoted}.migrations"
    )))
    .fetch_one(&mut *tx)
    .await
    .and_then(|row| row.try_get(0))
    .map_err(|err| map("migrate: read version", err))?;
    for migration in MIGRATIONS.iter().filter(|m| m.version > applied) {
        let sql = migration.sql.replace("{schema}", quoted);
        sqlx::raw_sql(AssertSqlSafe(sql))
            .execute(&mut *tx)
            .await
            .map_err(|err| {
                let what = format!("migration {} ({})", migration.version, migration.name);
                map(&what, err)
            })?;
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {quoted}.migrations (version, name) VALUES ($1, $2)"
        )))
        .bind(migration.version)
        .bind(migration.name)
        .execute(&mut *tx)
        .await
        .map_err(|err| map("migrate: record version", err))?;
        tracing::info!(
            schema,
            version = migration.version,
            name = migration.name,
            "applied migration"
        );
    }
    tx.commit().await.map_err(|err| map("migrate: commit", err))
}

/// The schema's applied version; 0 when it has no migrations table yet.
pub(crate) async fn current_version(pool: &PgPool, quoted: &str) -> Result<i32> {
    let table = format!("{quoted}.migrations");
    let exists: bool = sqlx::query("SELECT to_regclass($1) IS NOT NULL")
        .bind(&table)
        .fetch_one(pool)
        .await
        .and_then(|row| row.try_get(0))
        .map_err(|err| map("migrate: look for the migrations table", err))?;
    if !exists {
        return Ok(0);
    }
    sqlx::query(AssertSqlSafe(format!(
        "SELECT coalesce(max(version), 0) FROM {table}"
    )))
    .fetch_one(pool)
    .await
    .and_then(|row| row.try_get(0))
    .map_err(|err| map("migrate: read version", err))
}

/// Checks a schema name and returns it quoted: lower-case ASCII letters, digits and
/// `_`, starting with a letter or `_`, at most 48 bytes (so derived names such as the
/// wake-up channel stay within Postgres' 63-byte identifiers), and not `pg_*`.
pub(crate) fn quote_schema(schema: &str) -> Result<String> {
    let valid_start = schema
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_lowercase() || b == b'_');
    let valid_rest = schema
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if !valid_start || !valid_rest || schema.len() > 48 || schema.starts_with("pg_") {
        return Err(Error::invalid(
            "schema",
            "must be 1..=48 bytes of a-z, 0-9 and _, start with a letter or _, and not start with pg_",
        ));
    }
    Ok(format!("\"{schema}\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names_are_checked_and_quoted() {
        assert_eq!(quote_schema("jobs").ok().as_deref(), Some("\"jobs\""));
        assert!(quote_schema("_x9").is_ok());
        for bad in ["", "Jobs", "9x", "a-b", "a\"b", "pg_jobs", &"x".repeat(49)] {
            assert_eq!(
                quote_schema(bad).err().and_then(|e| e.invalid_field()),
                Some("schema"),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn lock_keys_differ_per_schema_and_are_stable() {
        assert_eq!(lock_key("jobs"), lock_key("jobs"));
        assert_ne!(lock_key("jobs"), lock_key("jobs2"));
        // The key every earlier build took for `jobs` (FNV-1a of
        // "jobs-postgres/migrate/jobs", computed apart from this crate): a build taking
        // another one would migrate beside an older build instead of after it.
        assert_eq!(lock_key("jobs"), -5_547_722_612_429_380_058);
    }

    #[test]
    fn migrations_are_numbered_in_order_from_one() {
        for (index, migration) in MIGRATIONS.iter().enumerate() {
            assert_eq!(migration.version, index as i32 + 1);
            assert!(migration.sql.contains("{schema}"));
        }
    }
}
