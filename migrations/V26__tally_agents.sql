-- The fleet page read flat, its last two counts over every agent kept in
-- the tally too (see V24), under two more kinds of key:
--
-- 'agents/<provider>': the provider's machines whose agent started, held
--     ones excepted (the fleet the recovery brake's limit is a share of).
-- 'endpoint/<endpoint>': agents told that callback endpoint at their
--     takeover (the fleet page's callback endpoints).
--
-- machine_tally_rebuild() counts every key afresh from the rows: the one
-- home of what each key counts, for the backfill below and for bulk loads
-- that load with the triggers off.

CREATE FUNCTION machine_tally_rebuild() RETURNS void LANGUAGE sql AS $$
TRUNCATE machine_tally, machine_tally_delta;
INSERT INTO machine_tally (key, n)
SELECT state, count(*) FROM machine_summary GROUP BY state
UNION ALL
SELECT 'agents', count(*) FROM machine_summary WHERE agent_started_at IS NOT NULL
UNION ALL
SELECT 'agents/' || provider, count(*) FROM machine_summary
 WHERE agent_started_at IS NOT NULL AND NOT held AND provider IS NOT NULL GROUP BY provider
UNION ALL
SELECT 'endpoint/' || agent_endpoint, count(*) FROM machine_agent_started
 WHERE agent_endpoint IS NOT NULL GROUP BY agent_endpoint;
$$;

-- A summary row's key under 'agents/<provider>', NULL when it counts in none.
CREATE FUNCTION machine_tally_agents_key(provider provider, started timestamptz, held boolean)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
SELECT CASE WHEN started IS NOT NULL AND NOT held AND provider IS NOT NULL
            THEN 'agents/' || provider END
$$;

CREATE OR REPLACE FUNCTION machine_tally_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO machine_tally_delta (key, n)
    SELECT state, count(*) FROM new_rows GROUP BY state
    UNION ALL
    SELECT 'agents', count(*) FROM new_rows WHERE agent_started_at IS NOT NULL HAVING count(*) > 0
    UNION ALL
    SELECT k, count(*) FROM (SELECT machine_tally_agents_key(provider, agent_started_at, held) k
                               FROM new_rows) r
     WHERE k IS NOT NULL GROUP BY k;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION machine_tally_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO machine_tally_delta (key, n)
    SELECT state, -count(*) FROM old_rows GROUP BY state
    UNION ALL
    SELECT 'agents', -count(*) FROM old_rows WHERE agent_started_at IS NOT NULL HAVING count(*) > 0
    UNION ALL
    SELECT k, -count(*) FROM (SELECT machine_tally_agents_key(provider, agent_started_at, held) k
                                FROM old_rows) r
     WHERE k IS NOT NULL GROUP BY k;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION machine_tally_updated() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    old_key text := machine_tally_agents_key(OLD.provider, OLD.agent_started_at, OLD.held);
    new_key text := machine_tally_agents_key(NEW.provider, NEW.agent_started_at, NEW.held);
BEGIN
    IF OLD.state <> NEW.state THEN
        INSERT INTO machine_tally_delta (key, n) VALUES (OLD.state, -1), (NEW.state, 1);
    END IF;
    IF (OLD.agent_started_at IS NULL) <> (NEW.agent_started_at IS NULL) THEN
        INSERT INTO machine_tally_delta (key, n)
            VALUES ('agents', CASE WHEN NEW.agent_started_at IS NULL THEN -1 ELSE 1 END);
    END IF;
    IF old_key IS DISTINCT FROM new_key THEN
        INSERT INTO machine_tally_delta (key, n)
        SELECT k, d FROM (VALUES (old_key, -1), (new_key, 1)) v (k, d) WHERE k IS NOT NULL;
    END IF;
    RETURN NULL;
END $$;

DROP TRIGGER machine_tally_update ON machine_summary;
CREATE TRIGGER machine_tally_update AFTER UPDATE ON machine_summary
    FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state
          OR (OLD.agent_started_at IS NULL) IS DISTINCT FROM (NEW.agent_started_at IS NULL)
          OR (OLD.provider, OLD.held) IS DISTINCT FROM (NEW.provider, NEW.held))
    EXECUTE FUNCTION machine_tally_updated();

-- Agents per callback endpoint, from machine_agent_started itself.
CREATE FUNCTION machine_tally_endpoints_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO machine_tally_delta (key, n)
    SELECT 'endpoint/' || agent_endpoint, count(*) FROM new_rows
     WHERE agent_endpoint IS NOT NULL GROUP BY agent_endpoint;
    RETURN NULL;
END $$;
CREATE FUNCTION machine_tally_endpoints_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO machine_tally_delta (key, n)
    SELECT 'endpoint/' || agent_endpoint, -count(*) FROM old_rows
     WHERE agent_endpoint IS NOT NULL GROUP BY agent_endpoint;
    RETURN NULL;
END $$;
CREATE FUNCTION machine_tally_endpoints_updated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO machine_tally_delta (key, n)
    SELECT 'endpoint/' || k, d FROM (VALUES (OLD.agent_endpoint, -1), (NEW.agent_endpoint, 1)) v (k, d)
     WHERE k IS NOT NULL;
    RETURN NULL;
END $$;
CREATE TRIGGER machine_tally_endpoints_insert AFTER INSERT ON machine_agent_started
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION machine_tally_endpoints_inserted();
CREATE TRIGGER machine_tally_endpoints_delete AFTER DELETE ON machine_agent_started
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION machine_tally_endpoints_deleted();
CREATE TRIGGER machine_tally_endpoints_update AFTER UPDATE ON machine_agent_started
    FOR EACH ROW
    WHEN (OLD.agent_endpoint IS DISTINCT FROM NEW.agent_endpoint)
    EXECUTE FUNCTION machine_tally_endpoints_updated();

SELECT machine_tally_rebuild();

-- One key's count: the tally and its pending deltas.
CREATE FUNCTION machine_tally_count(k text) RETURNS bigint LANGUAGE sql STABLE AS $$
SELECT COALESCE(sum(n), 0)::bigint FROM (
    SELECT n FROM machine_tally WHERE key = k
    UNION ALL SELECT n FROM machine_tally_delta WHERE key = k) t
$$;
