-- Who reached a machine's serial console over shepherd's SSH, when, and
-- whether they held its keyboard: every connection, from its login to its
-- end, kept with the machine (the audit the machine page shows).

CREATE TABLE console_session (
    session_id uuid PRIMARY KEY,
    machine_id uuid NOT NULL REFERENCES machines (machine_id) ON DELETE CASCADE,
    -- 'operator NAME' (the comment of their key in console.operator_keys)
    -- or 'tenant project PROJECT key LABEL'.
    who text NOT NULL,
    -- The SHA-256 fingerprint of the key they logged in with.
    key_fingerprint text NOT NULL,
    -- Where from (the client's address), as the server saw it.
    peer text NULL,
    started_at timestamptz NOT NULL DEFAULT now(),
    ended_at timestamptz NULL,
    -- They held the keyboard at some time (the first on a console does;
    -- the others read until it is free).
    wrote boolean NOT NULL DEFAULT false,
    -- Keystrokes sent to the machine, and bytes it printed to them.
    bytes_typed bigint NOT NULL DEFAULT 0,
    bytes_shown bigint NOT NULL DEFAULT 0,
    -- Why it ended: 'left' (the escape), 'disconnected', 'console ended: …'.
    end_reason text NULL
);
CREATE INDEX console_session_machine ON console_session (machine_id, started_at DESC);
