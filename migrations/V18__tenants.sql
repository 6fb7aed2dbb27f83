-- Tenants on owned racks (issue 41): projects own machines, their tokens
-- reach the Metal API's device subset, and a device is a tenant's hold on
-- one machine, from its creation to the erasure that gives it back.

-- A tenant's project. Its machines: those assigned to it
-- (machine_project), and, when shared_pool, any machine no project holds.
CREATE TABLE project (
    project_id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    name text NOT NULL UNIQUE CHECK (name <> '' AND length(name) <= 80),
    created_at timestamptz NOT NULL DEFAULT now(),
    created_by text NOT NULL,
    -- Devices at once at most (NULL: no limit).
    max_devices integer NULL CHECK (max_devices >= 0),
    shared_pool boolean NOT NULL DEFAULT true
);

-- A machine an operator gave a project (its hardware reservations).
CREATE TABLE machine_project (
    machine_id uuid PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
    project_id uuid NOT NULL REFERENCES project (project_id) ON DELETE RESTRICT,
    assigned_at timestamptz NOT NULL,
    assigned_by text NOT NULL
);
CREATE INDEX machine_project_project ON machine_project (project_id);

-- A project's API token. Only its SHA-256 is kept (the value is shown
-- once, when it is made); a revoked token stays, for the audit.
CREATE TABLE api_token (
    token_id uuid PRIMARY KEY,
    project_id uuid NOT NULL REFERENCES project (project_id) ON DELETE CASCADE,
    read_only boolean NOT NULL,
    description text NULL,
    token_sha256 bytea NOT NULL UNIQUE CHECK (length(token_sha256) = 32),
    created_at timestamptz NOT NULL,
    created_by text NOT NULL,
    revoked_at timestamptz NULL,
    revoked_by text NULL,
    -- Kept to the minute.
    last_used_at timestamptz NULL
);
CREATE INDEX api_token_project ON api_token (project_id);

-- A project's SSH keys (the Metal API's project keys).
CREATE TABLE project_ssh_key (
    key_id uuid PRIMARY KEY,
    project_id uuid NOT NULL REFERENCES project (project_id) ON DELETE CASCADE,
    label text NOT NULL,
    key text NOT NULL,
    fingerprint text NOT NULL,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    UNIQUE (project_id, fingerprint)
);

-- A tenant's device: one machine, installed with the operating system and
-- first-boot data asked for. install_generation is the installation asked
-- for it (the machine's machine_installation generation); once deleted
-- (deleting_at), erase_generation is the erasure that gives the machine
-- back, and deleted_at is set when that erasure succeeded.
CREATE TABLE device (
    device_id uuid PRIMARY KEY,
    project_id uuid NOT NULL REFERENCES project (project_id) ON DELETE RESTRICT,
    machine_id uuid NOT NULL REFERENCES machines (machine_id) ON DELETE CASCADE,
    hostname text NOT NULL,
    description text NULL,
    tags text[] NOT NULL DEFAULT '{}',
    plan text NOT NULL,
    metro text NOT NULL,
    operating_system text NOT NULL,
    userdata text NOT NULL DEFAULT '',
    customdata jsonb NOT NULL DEFAULT '{}',
    -- The public keys installed (OpenSSH's one-line form).
    ssh_keys text[] NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL,
    created_by text NOT NULL,
    updated_at timestamptz NOT NULL,
    install_generation integer NULL,
    -- The installation asked last was a reinstallation.
    reinstalling boolean NOT NULL DEFAULT false,
    -- The tenant powered it off (power_off) and has not powered it on.
    powered_off boolean NOT NULL DEFAULT false,
    locked boolean NOT NULL DEFAULT false,
    deleting_at timestamptz NULL,
    deleted_by text NULL,
    -- How its machine's disks are erased (metal.erase_mode when deleted).
    erase_mode text NULL,
    erase_generation integer NULL,
    deleted_at timestamptz NULL,
    -- The Metal state last written as an event (the devices round).
    last_state text NULL
);
-- One device per machine at a time: two creates racing for the last
-- machine cannot both have it.
CREATE UNIQUE INDEX device_machine_open ON device (machine_id) WHERE deleted_at IS NULL;
CREATE INDEX device_project ON device (project_id, created_at) WHERE deleted_at IS NULL;

-- What happened to a project's devices, as the Metal API's events.
CREATE TABLE project_event (
    event_id uuid PRIMARY KEY,
    project_id uuid NOT NULL REFERENCES project (project_id) ON DELETE CASCADE,
    device_id uuid NULL,
    type text NOT NULL,
    body text NOT NULL,
    "timestamp" timestamptz NOT NULL
);
CREATE INDEX project_event_project ON project_event (project_id, "timestamp" DESC);
CREATE INDEX project_event_device ON project_event (device_id, "timestamp" DESC)
    WHERE device_id IS NOT NULL;

-- The audit of projects and tokens (made, revoked; machines assigned):
-- append-only, like operator_action.
CREATE TABLE tenant_audit (
    tenant_audit_id uuid PRIMARY KEY,
    "timestamp" timestamptz NOT NULL,
    actor text NOT NULL,
    action text NOT NULL CHECK (action IN ('project-create', 'token-create', 'token-revoke',
                                           'assign', 'unassign', 'project-limit')),
    project_id uuid NULL,
    token_id uuid NULL,
    machine_id uuid NULL,
    detail text NOT NULL
);
CREATE INDEX tenant_audit_project ON tenant_audit (project_id, "timestamp");

-- A tenant's power actions go through the Recoverer's lease, like an
-- operator's reboot ('reboot', which expects the agent back): 'cycle'
-- (a reboot of the tenant's system), 'off' or 'on', through the BMC.
ALTER TABLE machine_reboot_request
    ADD COLUMN power text NOT NULL DEFAULT 'reboot'
        CHECK (power IN ('reboot', 'cycle', 'off', 'on'));

ALTER TABLE operator_action DROP CONSTRAINT operator_action_action_check;
ALTER TABLE operator_action ADD CONSTRAINT operator_action_action_check
    CHECK (action IN ('retry', 'retakeover', 'reboot', 'hold', 'release', 'release-brake', 'install',
                      'inspect', 'accept-hardware', 'deprovision', 'accept', 'power-off', 'power-on'));
