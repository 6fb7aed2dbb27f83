-- Recovery that never hurts a healthy fleet.
--
-- 1. One callback identity for every shepherd on this BMDB: the CA agents
--    are told to trust lives here, so any live shepherd can serve any agent.
--    Whoever can write this database already controls the fleet (agent keys,
--    reboots); read access to this table should be kept to shepherd's role.
CREATE TABLE callback_ca (
    callback_ca_id smallint PRIMARY KEY DEFAULT 1 CHECK (callback_ca_id = 1),
    -- DER of the CA certificate (TakeoverInit.ca_certificate).
    certificate bytea NOT NULL,
    -- PKCS#8 PEM of its private key.
    private_key text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- 2. Silence is judged only while someone was listening. Every shepherd that
--    serves an endpoint extends served_until with each session heartbeat;
--    serving_since is the start of the current unbroken stretch (it restarts
--    when served_until had passed). A machine is silent only if its endpoint
--    has been served for the whole threshold.
CREATE TABLE callback_endpoint (
    endpoint text PRIMARY KEY,
    serving_since timestamptz NOT NULL,
    served_until timestamptz NOT NULL
);

-- The endpoint an agent was given at its takeover (NULL: taken over before
-- this column, or by another tool; judged by the judging shepherd's own).
ALTER TABLE machine_agent_started ADD COLUMN agent_endpoint text NULL;

-- 3. What a finished piece of work did (a recovery: "agent restarted",
--    "rebooted", "taken over again"). NULL for failures, which say why in
--    failed_cause, and for rows written by other tools.
ALTER TABLE work_history ADD COLUMN detail text NULL;

-- 4. The brake on power actions for silence. Every power action the
--    Recoverer takes is logged here first, in a transaction that locks the
--    brake's row: the budget (power actions for silence in the window) holds
--    across all shepherds. No foreign key: it outlives machines.
CREATE TABLE recovery_power_action (
    machine_id uuid NOT NULL,
    "timestamp" timestamptz NOT NULL DEFAULT now(),
    -- An operator asked for it (never braked), else silence.
    requested boolean NOT NULL
);
CREATE INDEX recovery_power_action_timestamp ON recovery_power_action ("timestamp");

CREATE TABLE recovery_brake (
    recovery_brake_id smallint PRIMARY KEY DEFAULT 1 CHECK (recovery_brake_id = 1),
    -- Set while the brake holds (first seen engaged), for the log and pages.
    engaged_since timestamptz NULL,
    engaged_reason text NULL,
    -- An operator's release: power actions for silence go ahead until then.
    released_until timestamptz NULL,
    released_by text NULL
);
INSERT INTO recovery_brake (recovery_brake_id) VALUES (1);

-- An operator's fleet-wide action (releasing the brake) names no machine.
ALTER TABLE operator_action ALTER COLUMN machine_id DROP NOT NULL;
ALTER TABLE operator_action DROP CONSTRAINT operator_action_action_check;
ALTER TABLE operator_action ADD CONSTRAINT operator_action_action_check
    CHECK (action IN ('retry', 'retakeover', 'reboot', 'hold', 'release', 'release-brake'));
