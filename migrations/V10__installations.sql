-- Operating system installations (CONTRACTS.md §4a): who asked for which
-- image, how far the agent has come, what happened, and rollouts over many
-- machines. The contract tables (machine_os_installation_request and
-- _report) stay the truth of what was asked and answered; these tables
-- say the rest.

-- The installation an operator asked for last, beside its request's bytes.
CREATE TABLE machine_installation (
    machine_id uuid PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
    generation int NOT NULL,
    image_url text NOT NULL,
    image_digest text NOT NULL,
    requested_at timestamptz NOT NULL,
    requested_by text NOT NULL,
    -- The rollout that asked, if one did.
    rollout_id uuid NULL
);

-- The latest progress the machine's agent reported
-- (HeartbeatRequest.installation_progress, as received).
CREATE TABLE machine_installation_progress (
    machine_id uuid PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
    generation bigint NOT NULL,
    progress_raw bytea NOT NULL,
    progress_at timestamptz NOT NULL
);

-- Append-only, like work_history: requested, installed, failed.
CREATE TABLE installation_history (
    machine_id uuid NOT NULL,
    generation int NOT NULL,
    event text NOT NULL CHECK (event IN ('requested', 'installed', 'failed')),
    "timestamp" timestamptz NOT NULL,
    detail text NULL
);
CREATE INDEX installation_history_machine ON installation_history (machine_id, "timestamp");

-- A report (from the heartbeat writer or any other tool) is history.
CREATE FUNCTION installation_history_on_report() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' OR OLD.generation IS DISTINCT FROM NEW.generation
       OR OLD.os_installation_result IS DISTINCT FROM NEW.os_installation_result THEN
        INSERT INTO installation_history (machine_id, generation, event, "timestamp")
        VALUES (NEW.machine_id, NEW.generation,
                CASE NEW.os_installation_result WHEN 'Success' THEN 'installed' ELSE 'failed' END,
                now());
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER installation_history_report
    AFTER INSERT OR UPDATE ON machine_os_installation_report
    FOR EACH ROW EXECUTE FUNCTION installation_history_on_report();

-- The summary says installing, installed or install-failed: a request
-- without its report, with a Success report, with an Error report.
ALTER TABLE machine_summary ADD COLUMN installation text NULL;

CREATE OR REPLACE FUNCTION machine_summary_installation(mid uuid) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE machine_summary s SET
        installation_fulfilled = COALESCE(i.fulfilled, false),
        installation = i.state
      FROM (SELECT bool_or(rq.generation = rp.generation) AS fulfilled,
                   max(CASE WHEN rq.machine_id IS NULL THEN NULL
                            WHEN rq.generation IS DISTINCT FROM rp.generation THEN 'installing'
                            WHEN rp.os_installation_result = 'Success' THEN 'installed'
                            ELSE 'install-failed' END) AS state
              FROM (SELECT mid AS machine_id) x
              LEFT JOIN machine_os_installation_request rq ON rq.machine_id = x.machine_id
              LEFT JOIN machine_os_installation_report rp ON rp.machine_id = x.machine_id) i
     WHERE s.machine_id = mid;
END $$;

DROP TRIGGER machine_summary_installation_report ON machine_os_installation_report;
CREATE TRIGGER machine_summary_installation_report
    AFTER INSERT OR DELETE OR UPDATE OF machine_id, generation, os_installation_result
    ON machine_os_installation_report
    FOR EACH ROW EXECUTE FUNCTION machine_summary_on_installation();

UPDATE machine_summary s SET installation =
    CASE WHEN rq.generation IS DISTINCT FROM rp.generation THEN 'installing'
         WHEN rp.os_installation_result = 'Success' THEN 'installed'
         ELSE 'install-failed' END
  FROM machine_os_installation_request rq
  LEFT JOIN machine_os_installation_report rp ON rp.machine_id = rq.machine_id
 WHERE rq.machine_id = s.machine_id;

-- Operators ask for installations; the audit says so.
ALTER TABLE operator_action DROP CONSTRAINT operator_action_action_check;
ALTER TABLE operator_action ADD CONSTRAINT operator_action_action_check
    CHECK (action IN ('retry', 'retakeover', 'reboot', 'hold', 'release', 'release-brake', 'install'));

-- A rollout: one image over a set of machines, at most max_parallel at
-- once, stopped once more than max_failures failed.
CREATE TABLE rollout (
    rollout_id uuid PRIMARY KEY,
    -- The ImageInstallation every machine is asked for (its bytes).
    image_raw bytea NOT NULL,
    image_url text NOT NULL,
    max_parallel int NOT NULL CHECK (max_parallel > 0),
    max_failures int NOT NULL CHECK (max_failures >= 0),
    -- The fleet filter that chose the machines, as the operator gave it.
    selection text NOT NULL,
    created_at timestamptz NOT NULL,
    created_by text NOT NULL,
    state text NOT NULL CHECK (state IN ('running', 'done', 'stopped', 'canceled')),
    ended_at timestamptz NULL,
    end_reason text NULL
);
CREATE INDEX rollout_running ON rollout (created_at) WHERE state = 'running';

CREATE TABLE rollout_machine (
    rollout_id uuid NOT NULL REFERENCES rollout (rollout_id) ON DELETE CASCADE,
    machine_id uuid NOT NULL,
    position int NOT NULL,
    state text NOT NULL CHECK (state IN ('waiting', 'running', 'done', 'failed', 'skipped')),
    -- The generation asked of the machine, once started.
    generation int NULL,
    started_at timestamptz NULL,
    ended_at timestamptz NULL,
    error text NULL,
    PRIMARY KEY (rollout_id, machine_id)
);
CREATE INDEX rollout_machine_order ON rollout_machine (rollout_id, state, position);
