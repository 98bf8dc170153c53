-- Migration 6: schedules (CONTRACT S1, S2). `spec` is the definition as durq-core
-- encodes it; the store reads and writes it whole. A new, empty table: nothing is
-- rewritten. Safe to run twice.
CREATE TABLE IF NOT EXISTS {schema}.schedules (
    namespace text NOT NULL,
    name      text NOT NULL,
    spec      text NOT NULL,
    enabled   boolean NOT NULL,
    last_tick bigint NOT NULL,
    PRIMARY KEY (namespace, name)
);
