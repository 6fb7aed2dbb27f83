-- Fleet-wide duties that one shepherd performs at a time (the Provisioner's
-- and the Updater's rounds: both spend the provider's API budget, which is
-- the project's, not the process's). A duty is held by a live session; it
-- passes to another when that session ends or its deadline passes.
CREATE TABLE fleet_duty (
    duty text PRIMARY KEY,
    session_id uuid NOT NULL REFERENCES sessions (session_id) ON DELETE CASCADE,
    held_since timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX fleet_duty_session ON fleet_duty (session_id);
