-- A console connection's row kept alive by the shepherd that serves it
-- (every 30 s, src/sos/mod.rs): a shepherd that stopped without ending
-- its connections (killed, its host lost) leaves rows no one touches, and
-- any shepherd's console server ends them (`seen_at` older than two
-- minutes) instead of showing them "on it now" for ever.
ALTER TABLE console_session ADD COLUMN seen_at timestamptz NOT NULL DEFAULT now();
CREATE INDEX console_session_open ON console_session (seen_at) WHERE ended_at IS NULL;
