-- tower-idempotency: who decided. Every resolution recorded from this version on names the
-- operator who made it (`tower-idempotency resolve --operator NAME`, or `$USER`; the
-- library's `PostgresStore::resolve` takes it as an argument).
--
-- The column is nullable only for the rows recorded before it existed: the store always
-- writes it, and never writes a blank one.

ALTER TABLE idempotency_resolutions ADD COLUMN IF NOT EXISTS operator text;
