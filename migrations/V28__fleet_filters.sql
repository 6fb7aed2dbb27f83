-- The fleet's filters beyond the state, read from indexes.
--
-- Each machine's plan (metal.plans: the first whose minimums its hardware
-- report meets, with the BMC's Secure Boot where the plan asks for it),
-- labeled by the plan-labels round (src/plan_labels.rs), so that the fleet
-- page and the API filter by plan in the BMDB instead of decoding every
-- machine's report per page.
--
-- A row is stale when what its plan is computed from changed since it was
-- labeled: the triggers below mark it on a new or changed hardware report
-- and on a change of the BMC's SecureBootEnable; the round marks every row
-- when the configured plans change (plan_catalog's fingerprint). Each mark
-- bumps the generation, and the round writes a label only over the
-- generation it read, so a report arriving while it computes is labeled
-- again, never hidden.

CREATE TABLE machine_plan (
    machine_id uuid PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
    -- The plan's slug; NULL: no plan takes the machine (or no report yet).
    plan text NULL,
    stale boolean NOT NULL DEFAULT true,
    generation bigint NOT NULL DEFAULT 1,
    labeled_at timestamptz NULL
);
CREATE INDEX machine_plan_stale ON machine_plan (machine_id) WHERE stale;
CREATE INDEX machine_plan_plan ON machine_plan (plan) WHERE plan IS NOT NULL;

-- The plans the labels were computed with: a fingerprint of metal.plans,
-- one row.
CREATE TABLE plan_catalog (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    fingerprint text NOT NULL,
    changed_at timestamptz NOT NULL DEFAULT now()
);

CREATE FUNCTION machine_plan_mark() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO machine_plan AS p (machine_id) VALUES (NEW.machine_id)
        ON CONFLICT (machine_id) DO UPDATE SET stale = true, generation = p.generation + 1;
    RETURN NULL;
END $$;

CREATE TRIGGER machine_plan_report_inserted AFTER INSERT ON machine_hardware_report
    FOR EACH ROW EXECUTE FUNCTION machine_plan_mark();
CREATE TRIGGER machine_plan_report_changed AFTER UPDATE ON machine_hardware_report
    FOR EACH ROW WHEN (OLD.hardware_report_raw IS DISTINCT FROM NEW.hardware_report_raw)
    EXECUTE FUNCTION machine_plan_mark();
CREATE TRIGGER machine_plan_secure_boot_inserted AFTER INSERT ON machine_bmc_facts
    FOR EACH ROW WHEN (NEW.secure_boot_enable IS NOT NULL)
    EXECUTE FUNCTION machine_plan_mark();
CREATE TRIGGER machine_plan_secure_boot_changed AFTER UPDATE ON machine_bmc_facts
    FOR EACH ROW WHEN (OLD.secure_boot_enable IS DISTINCT FROM NEW.secure_boot_enable)
    EXECUTE FUNCTION machine_plan_mark();

-- Machines that reported already: labeled by the first round.
INSERT INTO machine_plan (machine_id) SELECT machine_id FROM machine_hardware_report;

-- The fleet filtered by location (a rack, a room): read from this index
-- when the location is a small part of the fleet.
CREATE INDEX machine_provided_location ON machine_provided (provider_location)
    WHERE provider_location IS NOT NULL;
