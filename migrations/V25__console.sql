-- What machines' serial consoles printed during the boots shepherd made
-- through their BMCs: one row per capture (a boot's console, read from
-- when shepherd asked the BMC until the boot ended), its last bytes kept.
-- The oldest captures of a machine beyond `console.kept` are deleted as a
-- new one starts.

CREATE TABLE machine_console (
    capture_id uuid PRIMARY KEY,
    machine_id uuid NOT NULL REFERENCES machines (machine_id) ON DELETE CASCADE,
    -- What shepherd was doing: 'enrollment', 'inspection', 'service',
    -- 'disk', 'recovery', ...
    cause text NOT NULL,
    -- How it was read, for people: 'sol ipmi://host:port', 'ssh user@host:22 "cmd"'.
    source text NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    ended_at timestamptz NULL,
    -- Bytes the console printed during the capture (more than it keeps).
    bytes_seen bigint NOT NULL DEFAULT 0,
    -- Its last bytes (console.tail_bytes at most), as printed.
    tail bytea NOT NULL DEFAULT '\x',
    -- The last time the console could not be read, why (never a secret).
    error text NULL
);
CREATE INDEX machine_console_machine ON machine_console (machine_id, started_at DESC);
