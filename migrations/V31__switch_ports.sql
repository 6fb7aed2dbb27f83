-- Tenants on networks of their own (src/switches): the switch ports each
-- machine's NICs and BMC are cabled to, what shepherd wants on each (the
-- provisioning network while it works on the machine, an idle VLAN that
-- reaches nothing while the machine is free, the tenant's networks once
-- its system is to boot, the BMC network for a BMC) and what the switch
-- last answered when read back. A change counts only once read back.

-- A port of a switch, and the machine it is cabled to.
CREATE TABLE switch_port (
    switch_name text NOT NULL,
    port_name text NOT NULL,
    machine_id uuid NULL REFERENCES machines (machine_id) ON DELETE SET NULL,
    -- 'nic': one of the machine's NICs; 'bmc': its BMC (never moved to a
    -- tenant's network).
    role text NOT NULL CHECK (role IN ('nic', 'bmc')),
    -- The NIC's MAC, when declared.
    mac text NULL,
    -- Declared in the configuration (else learned).
    declared boolean NOT NULL DEFAULT true,
    -- What shepherd wants: why ('provisioning', 'idle', 'tenant', 'bmc'),
    -- the untagged VLAN and the tagged ones, and since when.
    want_purpose text NULL,
    want_native integer NULL CHECK (want_native BETWEEN 1 AND 4094),
    want_tagged integer[] NOT NULL DEFAULT '{}',
    want_since timestamptz NULL,
    -- What the switch answered when last read back.
    seen_native integer NULL,
    seen_tagged integer[] NULL,
    seen_at timestamptz NULL,
    -- When a change of shepherd's was last read back on it.
    changed_at timestamptz NULL,
    -- The last change that failed, and why (cleared once one holds).
    error text NULL,
    error_at timestamptz NULL,
    PRIMARY KEY (switch_name, port_name)
);
CREATE INDEX switch_port_machine ON switch_port (machine_id) WHERE machine_id IS NOT NULL;
CREATE UNIQUE INDEX switch_port_bmc ON switch_port (machine_id) WHERE role = 'bmc';

-- Every change shepherd made on a switch, read back (append-only: it
-- outlives the port's machine).
CREATE TABLE switch_change (
    change_id bigserial PRIMARY KEY,
    switch_name text NOT NULL,
    port_name text NOT NULL,
    machine_id uuid NULL,
    purpose text NOT NULL,
    before_native integer NULL,
    before_tagged integer[] NULL,
    after_native integer NULL,
    after_tagged integer[] NOT NULL,
    session_id uuid NULL,
    at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX switch_change_port ON switch_change (switch_name, port_name, at);
CREATE INDEX switch_change_machine ON switch_change (machine_id, at);

-- A switch as shepherd last reached it: one session changes it at a time
-- (the holder, until its session's deadline), failures back off.
CREATE TABLE switch_state (
    switch_name text PRIMARY KEY,
    session_id uuid NULL,
    held_until timestamptz NULL,
    -- Its SSH host key, recorded at first contact (accept-new).
    host_key text NULL,
    reached_at timestamptz NULL,
    failed_at timestamptz NULL,
    error text NULL,
    failures integer NOT NULL DEFAULT 0,
    not_before timestamptz NOT NULL DEFAULT now(),
    changes bigint NOT NULL DEFAULT 0
);

-- A project's networks: its virtual networks (the Metal API's, each a
-- VLAN of network.tenant_vlans, given by the tenant or the lowest free),
-- and its own network (`own`: the VLAN its devices' layer-3 ports share,
-- made by shepherd, never listed or deleted). A VLAN is one project's:
-- the switches are shared.
CREATE TABLE virtual_network (
    virtual_network_id uuid PRIMARY KEY,
    project_id uuid NOT NULL REFERENCES project (project_id) ON DELETE CASCADE,
    vxlan integer NOT NULL UNIQUE CHECK (vxlan BETWEEN 1 AND 4094),
    metro text NOT NULL,
    description text NULL,
    tags text[] NOT NULL DEFAULT '{}',
    own boolean NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX virtual_network_own ON virtual_network (project_id) WHERE own;
CREATE INDEX virtual_network_project ON virtual_network (project_id, created_at);

-- A device's ports as the Metal API shows them: one per NIC cabled to a
-- switch (eth0, eth1, ... by switch and port), and its bond (bond0). A
-- NIC in the bond takes the bond's mode and VLANs; one out of it has
-- its own. `layer2` false: the port is on the project's own network
-- (untagged) with its VLANs tagged beside it (hybrid); true: only its
-- VLANs, the native one untagged.
CREATE TABLE device_port (
    port_id uuid PRIMARY KEY,
    device_id uuid NOT NULL REFERENCES device (device_id) ON DELETE CASCADE,
    name text NOT NULL,
    -- The NIC's switch port (NULL for the bond).
    switch_name text NULL,
    port_name text NULL,
    mac text NULL,
    bonded boolean NOT NULL DEFAULT true,
    layer2 boolean NOT NULL DEFAULT false,
    native_network uuid NULL REFERENCES virtual_network (virtual_network_id),
    UNIQUE (device_id, name)
);
CREATE INDEX device_port_switch ON device_port (switch_name, port_name);

-- The virtual networks assigned to a port (a network in use is not
-- deleted: RESTRICT).
CREATE TABLE device_port_vlan (
    assignment_id uuid PRIMARY KEY,
    port_id uuid NOT NULL REFERENCES device_port (port_id) ON DELETE CASCADE,
    virtual_network_id uuid NOT NULL REFERENCES virtual_network (virtual_network_id) ON DELETE RESTRICT,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (port_id, virtual_network_id)
);

-- A port's VLAN assignment batches (the Metal API's), as asked.
CREATE TABLE port_vlan_batch (
    batch_id uuid PRIMARY KEY,
    port_id uuid NOT NULL REFERENCES device_port (port_id) ON DELETE CASCADE,
    project_id uuid NOT NULL,
    -- [{vlan, state, native}], as applied.
    assignments jsonb NOT NULL,
    error_messages text[] NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX port_vlan_batch_port ON port_vlan_batch (port_id, created_at);

-- The machine's network, in its summary: NULL (no switch port known),
-- 'moving' (a NIC port not yet read back as wanted), or the purpose every
-- NIC port holds ('provisioning', 'idle', 'tenant'); and since when.
-- The BMC's boots wait for 'provisioning' (a live agent) or 'tenant' (the
-- tenant's system), and silence is judged only on the provisioning
-- network.
ALTER TABLE machine_summary
    ADD COLUMN network text NULL,
    ADD COLUMN network_since timestamptz NULL;

CREATE FUNCTION machine_network_refresh(m uuid) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    now_network text;
BEGIN
    SELECT CASE WHEN count(*) = 0 THEN NULL
                WHEN bool_or(want_purpose IS NULL OR seen_native IS DISTINCT FROM want_native
                             OR seen_tagged IS DISTINCT FROM want_tagged) THEN 'moving'
                WHEN count(DISTINCT want_purpose) = 1 THEN min(want_purpose)
                ELSE 'moving' END
      INTO now_network
      FROM switch_port WHERE machine_id = m AND role = 'nic';
    UPDATE machine_summary
       SET network = now_network,
           network_since = CASE WHEN network IS DISTINCT FROM now_network THEN now()
                                ELSE network_since END
     WHERE machine_id = m AND network IS DISTINCT FROM now_network;
END $$;

CREATE FUNCTION machine_summary_on_switch_port() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' OR (TG_OP = 'UPDATE' AND OLD.machine_id IS DISTINCT FROM NEW.machine_id) THEN
        IF OLD.machine_id IS NOT NULL THEN
            PERFORM machine_network_refresh(OLD.machine_id);
        END IF;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') AND NEW.machine_id IS NOT NULL THEN
        PERFORM machine_network_refresh(NEW.machine_id);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER machine_summary_switch_port AFTER INSERT OR UPDATE OR DELETE ON switch_port
    FOR EACH ROW EXECUTE FUNCTION machine_summary_on_switch_port();
