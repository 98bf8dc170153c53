-- Migration 4: paused queues (CONTRACT Q1). A claim skips every named queue that has
-- a row here; enqueues and every other call ignore the table.
--
-- A new, empty table: nothing is rewritten or scanned. Older builds keep working on a
-- migrated schema, and do not see pauses. Safe to run twice (`IF NOT EXISTS`).
CREATE TABLE IF NOT EXISTS {schema}.paused_queues (
    namespace text NOT NULL,
    queue     text NOT NULL,
    PRIMARY KEY (namespace, queue)
);
