-- The BMDB schema of shared/CONTRACTS.md §2. Table, column and enum names are
-- part of the contract with other tools: never rename them.

CREATE TYPE process AS ENUM (
    'UnitTest1', 'UnitTest2', 'ShepherdAccess', 'ShepherdAgentStart', 'ShepherdRecovery'
);
CREATE TYPE provider AS ENUM ('Equinix', 'Lumen', 'None');
CREATE TYPE provider_status AS ENUM (
    'Missing', 'Provisioning', 'ProvisioningFailedPermanent', 'Running', 'Stopped', 'Unknown'
);
CREATE TYPE work_history_event AS ENUM ('Started', 'Finished', 'Failed', 'Canceled');
CREATE TYPE machine_os_installation_result AS ENUM ('Success', 'Error');

CREATE TABLE machines (
    machine_id uuid PRIMARY KEY,
    machine_created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE sessions (
    session_id uuid PRIMARY KEY,
    session_component_name text NOT NULL,
    session_runtime_info text NOT NULL,
    session_created_at timestamptz NOT NULL,
    session_interval_seconds int NOT NULL,
    session_deadline timestamptz NOT NULL
);
-- Garbage collection of expired sessions scans by deadline.
CREATE INDEX sessions_deadline ON sessions (session_deadline);

CREATE TABLE work (
    machine_id uuid NOT NULL REFERENCES machines (machine_id) ON DELETE RESTRICT,
    session_id uuid NOT NULL REFERENCES sessions (session_id) ON DELETE CASCADE,
    process process NOT NULL,
    PRIMARY KEY (machine_id, session_id, process),
    UNIQUE (machine_id, process)
);
-- ShepherdAccess, ShepherdAgentStart and ShepherdRecovery exclude each other on
-- one machine. The database enforces it, whatever the isolation level.
CREATE UNIQUE INDEX work_shepherd_exclusive ON work (machine_id)
    WHERE process IN ('ShepherdAccess', 'ShepherdAgentStart', 'ShepherdRecovery');
-- Session deletion cascades to work by session.
CREATE INDEX work_session ON work (session_id);

-- Append-only audit. No foreign key: it outlives machine deletion.
CREATE TABLE work_history (
    -- Added column: a total order of events (timestamps can tie).
    work_history_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    machine_id uuid NOT NULL,
    process process NOT NULL,
    event work_history_event NOT NULL,
    "timestamp" timestamptz NOT NULL,
    failed_cause text NULL
);
CREATE INDEX work_history_machine ON work_history (machine_id, work_history_id);

CREATE TABLE work_backoff (
    machine_id uuid NOT NULL REFERENCES machines (machine_id) ON DELETE CASCADE,
    process process NOT NULL,
    until timestamptz NOT NULL,
    cause text NOT NULL,
    last_interval_seconds bigint NULL,
    UNIQUE (machine_id, process)
);

CREATE TABLE machine_provided (
    machine_id uuid PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
    provider provider NOT NULL,
    provider_id varchar(128) NOT NULL,
    provider_reservation_id text NULL,
    provider_ip_address text NULL,
    provider_location text NULL,
    provider_status provider_status NULL,
    UNIQUE (provider, provider_id)
);

CREATE TABLE machine_agent_started (
    machine_id uuid PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
    agent_started_at timestamptz NOT NULL,
    agent_public_key bytea NOT NULL
);

CREATE TABLE machine_agent_heartbeat (
    machine_id uuid PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
    agent_heartbeat_at timestamptz NOT NULL
);

CREATE TABLE machine_hardware_report (
    machine_id uuid PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
    hardware_report_raw bytea NOT NULL
);

CREATE TABLE machine_os_installation_request (
    machine_id uuid PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
    generation int NOT NULL,
    os_installation_request_raw bytea NOT NULL
);

CREATE TABLE machine_os_installation_report (
    machine_id uuid PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
    generation int NOT NULL,
    os_installation_result machine_os_installation_result NOT NULL,
    os_installation_report_raw bytea NOT NULL
);
