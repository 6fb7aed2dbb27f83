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

-- A project's own network: the VLAN its machines share when no other is
-- asked (the Metal API's layer3 ports).
CREATE TABLE project_vlan (
    project_id uuid PRIMARY KEY REFERENCES project (project_id) ON DELETE CASCADE,
    vlan integer NOT NULL UNIQUE CHECK (vlan BETWEEN 1 AND 4094),
    allocated_at timestamptz NOT NULL DEFAULT now()
);

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
