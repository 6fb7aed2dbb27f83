-- Switches joined to each other (src/switches): a switch's uplinks
-- (`network.switches[].uplinks`) are ports of their own role, cabled to no
-- machine, that carry every network but the idle one, tagged.
ALTER TABLE switch_port DROP CONSTRAINT switch_port_role_check;
ALTER TABLE switch_port ADD CONSTRAINT switch_port_role_check
    CHECK (role IN ('nic', 'bmc', 'uplink'));
ALTER TABLE switch_port ADD CONSTRAINT switch_port_uplink_of_no_machine
    CHECK (role <> 'uplink' OR machine_id IS NULL);
