-- Operator actions: holds, reboot requests, and the audit of every action an
-- operator took on a machine (retry, retake over, reboot, hold, release).

-- A held machine is skipped by every control loop until it is released.
CREATE TABLE machine_hold (
    machine_id uuid PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
    held_at timestamptz NOT NULL,
    held_by text NOT NULL,
    reason text NULL
);

-- "Reboot this machine now": the Recoverer picks it up on its own lease,
-- reboots it through the provider and deletes the row when done.
CREATE TABLE machine_reboot_request (
    machine_id uuid PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
    requested_at timestamptz NOT NULL,
    requested_by text NOT NULL,
    reason text NULL
);

-- Append-only audit, like work_history: no foreign key, it outlives the
-- machine. operator_action_id is chosen by the caller, so that a request
-- retried after a lost commit finds its own row instead of acting twice.
CREATE TABLE operator_action (
    operator_action_id uuid PRIMARY KEY,
    machine_id uuid NOT NULL,
    action text NOT NULL CHECK (action IN ('retry', 'retakeover', 'reboot', 'hold', 'release')),
    -- An admin token's name, or 'cli'.
    actor text NOT NULL,
    "timestamp" timestamptz NOT NULL,
    reason text NULL,
    -- What the action did ("cleared the ShepherdAgentStart backoff", …).
    detail text NOT NULL
);
CREATE INDEX operator_action_machine ON operator_action (machine_id, "timestamp");

-- The fleet page charts the last hours of history.
CREATE INDEX work_history_timestamp ON work_history ("timestamp");

ALTER TABLE machine_summary
    ADD COLUMN held boolean NOT NULL DEFAULT false,
    ADD COLUMN reboot_requested boolean NOT NULL DEFAULT false;

-- Requested reboots, found without scanning the fleet.
CREATE INDEX machine_summary_reboot_requested ON machine_summary (provider)
    WHERE reboot_requested;

CREATE FUNCTION machine_summary_on_hold() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        UPDATE machine_summary SET held = false WHERE machine_id = OLD.machine_id;
    ELSE
        UPDATE machine_summary SET held = true WHERE machine_id = NEW.machine_id;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER machine_summary_hold AFTER INSERT OR DELETE ON machine_hold
    FOR EACH ROW EXECUTE FUNCTION machine_summary_on_hold();

CREATE FUNCTION machine_summary_on_reboot_request() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        UPDATE machine_summary SET reboot_requested = false WHERE machine_id = OLD.machine_id;
    ELSE
        UPDATE machine_summary SET reboot_requested = true WHERE machine_id = NEW.machine_id;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER machine_summary_reboot_request AFTER INSERT OR DELETE ON machine_reboot_request
    FOR EACH ROW EXECUTE FUNCTION machine_summary_on_reboot_request();
