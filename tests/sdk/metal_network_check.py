"""A tenant's ports and virtual networks, through Equinix's own Python SDK.

The SDK (`equinix` 0.19.0, `equinix.services.metalv1`: `PortsApi`,
`VLANsApi`) against shepherd's Metal API over HTTPS, as a user of Equinix
Metal would drive it: two virtual networks made (one with the VLAN asked),
listed and read; the device's bond given one (hybrid-bonded), converted to
layer 2 with the other, the first made native; the network in use refused
deletion; a batch taking the second off, waited for until `completed`
(the switch read back); the bond broken and made again; everything taken
off, back to layer 3, the networks deleted. Every answer goes through the
SDK's pydantic models, which raise on any shape they reject.

Usage: metal_network_check.py URL PROJECT_ID TOKEN DEVICE_ID METRO CA_FILE

Prints one JSON object on stdout: each step's network type and what was
refused. Exit status 0 only if every step went as asked.
"""

import json
import sys
import time

import equinix.services.metalv1 as metal
from equinix.services.metalv1.exceptions import ApiException

TIMEOUT = 120


def main():
    url, project, token, device_id, metro_code, ca = sys.argv[1:7]
    cfg = metal.Configuration(host=url)
    cfg.api_key["x_auth_token"] = token
    cfg.ssl_ca_cert = ca
    client = metal.ApiClient(cfg)
    ports = metal.PortsApi(client)
    vlans = metal.VLANsApi(client)
    devices = metal.DevicesApi(client)
    out = {"types": [], "refused": []}

    def step(name, port):
        out["types"].append([name, port.network_type])
        print(f"metal_network_check: {name}: {port.network_type}", file=sys.stderr, flush=True)

    device = devices.find_device_by_id(device_id)
    by_name = {p.name: p for p in device.network_ports}
    assert "bond0" in by_name and "eth0" in by_name, device.network_ports
    bond = by_name["bond0"]
    eth0 = by_name["eth0"]
    assert bond.type == "NetworkBondPort" and eth0.type == "NetworkPort", device.network_ports
    assert eth0.data.bonded and eth0.bond.id == bond.id, eth0
    step("created", bond)
    assert bond.network_type == "layer3"

    # Two virtual networks: the lowest free VLAN, and one asked for.
    first = vlans.create_virtual_network(
        project, metal.VirtualNetworkCreateInput(metro=metro_code, description="sdk first")
    )
    second = vlans.create_virtual_network(
        project,
        metal.VirtualNetworkCreateInput(metro=metro_code, vxlan=first.vxlan + 7, tags=["sdk"]),
    )
    assert second.vxlan == first.vxlan + 7, second
    listed = vlans.find_virtual_networks(project, metro=metro_code).virtual_networks
    assert {n.id for n in listed} == {first.id, second.id}, listed
    assert vlans.get_virtual_network(first.id).description == "sdk first"
    try:
        vlans.create_virtual_network(
            project, metal.VirtualNetworkCreateInput(metro=metro_code, vxlan=second.vxlan)
        )
        raise AssertionError("a second network on one VLAN was made")
    except ApiException as e:
        assert e.status == 422, e
        out["refused"].append(["create on a VLAN in use", e.status])
    out["vxlans"] = [first.vxlan, second.vxlan]

    # The bond: hybrid-bonded with the first (by its ID), layer 2 with the
    # second (by its VLAN), the first native.
    p = ports.assign_port(bond.id, metal.PortAssignInput(vnid=first.id))
    step("assign", p)
    assert p.network_type == "hybrid-bonded", p
    assert [v.id for v in p.virtual_networks] == [first.id], p
    p = ports.convert_layer2(bond.id, metal.PortAssignInput(vnid=str(second.vxlan)))
    step("layer-2", p)
    assert p.network_type == "layer2-bonded", p
    p = ports.assign_native_vlan(bond.id, str(first.id))
    step("native", p)
    assert p.native_virtual_network.id == first.id, p
    got = ports.find_port_vlan_assignments(bond.id).vlan_assignments
    assert sorted((a.vlan, a.native) for a in got) == [(first.vxlan, True), (second.vxlan, False)], got
    one = ports.find_port_vlan_assignment_by_port_id_and_assignment_id(bond.id, got[0].id)
    assert one.id == got[0].id, one
    try:
        ports.assign_port(eth0.id, metal.PortAssignInput(vnid=first.id))
        raise AssertionError("a NIC in the bond took a network of its own")
    except ApiException as e:
        assert e.status == 422, e
        out["refused"].append(["assign to a NIC in the bond", e.status])

    # In use: not deleted.
    try:
        vlans.delete_virtual_network(first.id)
        raise AssertionError("a network in use was deleted")
    except ApiException as e:
        assert e.status == 422, e
        out["refused"].append(["delete a network in use", e.status])

    # A batch takes the second off; completed once the switch says so.
    batch = ports.create_port_vlan_assignment_batch(
        bond.id,
        metal.PortVlanAssignmentBatchCreateInput(
            vlan_assignments=[
                metal.PortVlanAssignmentBatchCreateInputVlanAssignmentsInner(
                    vlan=str(second.vxlan), state="unassigned"
                )
            ]
        ),
    )
    assert batch.quantity == 1 and batch.state in ("queued", "in_progress", "completed"), batch
    deadline = time.time() + TIMEOUT
    while True:
        b = ports.find_port_vlan_assignment_batch_by_port_id_and_batch_id(bond.id, batch.id)
        if b.state == "completed":
            break
        assert b.state in ("queued", "in_progress"), b
        assert time.time() < deadline, f"batch still {b.state}"
        time.sleep(0.5)
    out["batch"] = b.state
    assert [x.id for x in ports.find_port_vlan_assignment_batches(bond.id).batches] == [batch.id]
    p = ports.find_port_by_id(bond.id)
    assert [v.id for v in p.virtual_networks] == [first.id], p
    step("batch", p)

    # The bond broken, and made again.
    p = ports.disbond_port(bond.id, bulk_disable=True)
    step("disbond", p)
    assert p.network_type == "layer2-individual", p
    assert not ports.find_port_by_id(eth0.id).data.bonded
    p = ports.bond_port(eth0.id, bulk_enable=True)
    step("bond", p)
    assert ports.find_port_by_id(eth0.id).data.bonded

    # Back to layer 3: refused while a network is assigned, then done.
    try:
        ports.convert_layer3(bond.id)
        raise AssertionError("converted to layer 3 with a network assigned")
    except ApiException as e:
        assert e.status == 422, e
        out["refused"].append(["layer 3 with a network assigned", e.status])
    p = ports.delete_native_vlan(bond.id)
    assert p.native_virtual_network is None, p
    p = ports.unassign_port(bond.id, metal.PortAssignInput(vnid=str(first.vxlan)))
    assert not p.virtual_networks, p
    p = ports.convert_layer3(bond.id)
    step("layer-3", p)
    assert p.network_type == "layer3", p
    vlans.delete_virtual_network(first.id)
    vlans.delete_virtual_network(second.id)
    assert not vlans.find_virtual_networks(project).virtual_networks
    print(json.dumps(out))


if __name__ == "__main__":
    main()
