-- Servicing: a machine brought to its baseline (firmware, BIOS settings,
-- RAID, Secure Boot) through its BMC while it is free, by the Servicer
-- (servicer.rs). One row per machine: its last servicing. Not a contract
-- table: shepherd's own.
CREATE TABLE machine_service (
    machine_id uuid PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
    -- Names this servicing (a new one per ask).
    service_id uuid NOT NULL,
    -- The baseline it applies ([[baselines]] name).
    baseline text NOT NULL,
    -- Asked of a tenant's machine by an operator who said so.
    forced boolean NOT NULL DEFAULT false,
    -- The rollout that asked, if one did.
    rollout_id uuid NULL,
    asked_by text NOT NULL,
    asked_at timestamptz NOT NULL DEFAULT now(),
    reason text NULL,
    -- asked: to be applied; restarting: applied, the machine's restart
    -- asked (through the Enroller's boot, or done by the Servicer), to be
    -- checked against its BMC after it; done; failed.
    phase text NOT NULL CHECK (phase IN ('asked', 'restarting', 'done', 'failed')),
    -- What was changed, for people.
    applied text NULL,
    -- Restarts this servicing made (at most one).
    restarts integer NOT NULL DEFAULT 0,
    restarted_at timestamptz NULL,
    -- Why it failed, with the BMC's words.
    error text NULL,
    ended_at timestamptz NULL
);
CREATE INDEX machine_service_rollout ON machine_service (rollout_id) WHERE rollout_id IS NOT NULL;

-- Every servicing's end, kept after the next one begins.
CREATE TABLE service_history (
    service_id uuid PRIMARY KEY,
    machine_id uuid NOT NULL,
    baseline text NOT NULL,
    rollout_id uuid NULL,
    asked_by text NOT NULL,
    asked_at timestamptz NOT NULL,
    phase text NOT NULL,
    applied text NULL,
    restarts integer NOT NULL,
    error text NULL,
    ended_at timestamptz NOT NULL
);
CREATE INDEX service_history_machine ON service_history (machine_id, ended_at);

-- The summary's view of it: 'servicing' (asked or restarting), 'failed'
-- (held from tenants until serviced again), NULL (none, or done).
ALTER TABLE machine_summary ADD COLUMN service text NULL;
CREATE INDEX machine_summary_servicing ON machine_summary (agent_start_not_before)
    WHERE service = 'servicing';

CREATE FUNCTION machine_summary_on_service() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        UPDATE machine_summary SET service = NULL WHERE machine_id = OLD.machine_id;
    ELSE
        UPDATE machine_summary SET service = CASE NEW.phase
                WHEN 'asked' THEN 'servicing' WHEN 'restarting' THEN 'servicing'
                WHEN 'failed' THEN 'failed' END
            WHERE machine_id = NEW.machine_id;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER machine_summary_service AFTER INSERT OR UPDATE OR DELETE ON machine_service
    FOR EACH ROW EXECUTE FUNCTION machine_summary_on_service();

-- A rollout may apply a baseline instead of installing an image.
ALTER TABLE rollout ADD COLUMN baseline text NULL;

-- The restart a servicing asks of a machine booted through its BMC: into
-- the live agent again.
ALTER TABLE machine_boot_request DROP CONSTRAINT machine_boot_request_cause_check;
ALTER TABLE machine_boot_request ADD CONSTRAINT machine_boot_request_cause_check
    CHECK (cause IN ('enroll', 'inspect', 'recovery', 'install', 'disk', 'deprovision', 'service'));

ALTER TABLE operator_action DROP CONSTRAINT operator_action_action_check;
ALTER TABLE operator_action ADD CONSTRAINT operator_action_action_check
    CHECK (action IN ('retry', 'retakeover', 'reboot', 'hold', 'release', 'release-brake', 'install',
                      'inspect', 'accept-hardware', 'deprovision', 'accept', 'power-off', 'power-on',
                      'service'));
