"""A tenant's whole life with a device, through Equinix's own Python SDK.

The SDK (`equinix` on PyPI, module `equinix.services.metalv1`, 0.19.0) is
pointed at shepherd's Metal API (directly over HTTPS, or through Prism's
validating proxy) as a user of Equinix Metal would point it at their racks:
it lists plans, operating systems and metros, adds a project SSH key,
creates a device with userdata and that key, waits for `active`, updates
it, reboots it, reinstalls it, reads its events and reservations, deletes
it and waits until it is gone. Every answer goes through the SDK's pydantic
models, which raise on any shape they reject.

Usage: metal_tenant_check.py URL PROJECT_ID TOKEN SSH_PUBLIC_KEY [CA_FILE]

Prints one JSON object on stdout: the device's ID, the states seen, and
the operations done. Exit status 0 only if the whole life went as asked.
"""

import json
import ssl
import sys
import time
import urllib.error
import urllib.request

import equinix.services.metalv1 as metal
from equinix.services.metalv1.exceptions import ApiException, NotFoundException

TIMEOUT = 240


def main():
    url, project, token, key = sys.argv[1:5]
    cfg = metal.Configuration(host=url)
    cfg.api_key["x_auth_token"] = token
    if len(sys.argv) > 5:
        cfg.ssl_ca_cert = sys.argv[5]
    client = metal.ApiClient(cfg)
    projects = metal.ProjectsApi(client)
    plans = metal.PlansApi(client)
    oses = metal.OperatingSystemsApi(client)
    metros = metal.MetrosApi(client)
    keys = metal.SSHKeysApi(client)
    devices = metal.DevicesApi(client)
    events = metal.EventsApi(client)
    reservations = metal.HardwareReservationsApi(client)
    done = []
    seen = []

    def step(name):
        done.append(name)
        print(f"metal_tenant_check: {name}", file=sys.stderr, flush=True)

    # The catalog.
    mine = projects.find_projects()
    assert [str(p.id) for p in mine.projects] == [project], mine
    assert projects.find_project_by_id(project).name
    every = projects.find_projects_all_pages()
    assert len(every.projects) == 1
    step("projects")
    plan_list = plans.find_plans()
    slugs = [p.slug for p in plan_list.plans]
    assert "c3.small.x86" in slugs, slugs
    assert [p.slug for p in plans.find_plans_by_project(project).plans] == slugs
    step("plans")
    os_list = oses.find_operating_systems()
    assert "debian_12" in [o.slug for o in os_list.operating_systems]
    step("operating systems")
    metro_list = metros.find_metros()
    # Only metros with machines (the rig's are all in sv).
    assert [m.code for m in metro_list.metros] == ["sv"], metro_list
    step("metros")

    # A project key, which the device gets.
    created_key = keys.create_project_ssh_key(
        project, metal.SSHKeyCreateInput(label="tenant", key=key)
    )
    assert created_key.fingerprint.startswith("SHA256:"), created_key
    assert [k.id for k in keys.find_project_ssh_keys(project).ssh_keys] == [created_key.id]
    # The project names its keys.
    hrefs = [k.href for k in projects.find_project_by_id(project).ssh_keys]
    assert hrefs == [f"/metal/v1/ssh-keys/{created_key.id}"], hrefs
    step("ssh key")

    # Refusals a tenant can read: a host name too long is not echoed back.
    try:
        devices.create_device(project, metal.CreateDeviceRequest(metal.DeviceCreateInMetroInput(
            metro=metal.MetroInputMetro("sv"), plan="c3.small.x86",
            operating_system="debian_12", hostname="h" * 300)))
        raise AssertionError("a 300-character host name was accepted")
    except ApiException as e:
        assert e.status == 422, e
        assert "300 characters" in e.body and "h" * 64 not in e.body, e.body
    if len(sys.argv) > 5:
        # A body that is not JSON says where it stops being JSON (sent
        # as a client would that builds its JSON by hand; Prism, in the
        # other run, would refuse it itself).
        req = urllib.request.Request(
            f"{url}/projects/{project}/devices", data=b'{1: "sv"}', method="POST",
            headers={"X-Auth-Token": token, "Content-Type": "application/json"})
        try:
            urllib.request.urlopen(req, context=ssl.create_default_context(cafile=sys.argv[5]))
            raise AssertionError("a body that is not JSON was accepted")
        except urllib.error.HTTPError as e:
            text = e.read().decode()
            assert e.code == 422, (e.code, text)
            assert "not JSON" in text and "line 1 column 2" in text and "?" not in text, text
    step("refusals")

    # The device.
    body = metal.DeviceCreateInMetroInput(
        metro=metal.MetroInputMetro("sv"),
        plan="c3.small.x86",
        operating_system="debian_12",
        hostname="sdk-web-1",
        description="made by the SDK",
        userdata="#cloud-config\nruncmd:\n  - echo hello from the tenant\n",
        project_ssh_keys=[str(created_key.id)],
        tags=["sdk"],
        customdata={"team": "blue"},
    )
    device = devices.create_device(project, metal.CreateDeviceRequest(body))
    assert device is not None and device.id, "201 with a Device"
    device_id = str(device.id)
    seen.append(device.state)
    assert device.state in ("queued", "provisioning"), device.state
    step("create")

    def wait(states, allowed):
        deadline = time.monotonic() + TIMEOUT
        while True:
            d = devices.find_device_by_id(device_id)
            if not seen or seen[-1] != d.state:
                seen.append(d.state)
            if d.state in states:
                return d
            assert d.state in allowed, f"device {device_id} went {d.state}"
            assert time.monotonic() < deadline, f"device {device_id} still {d.state}"
            time.sleep(0.5)

    active = wait(["active"], ["queued", "provisioning"])
    assert active.hostname == "sdk-web-1"
    assert active.plan.slug == "c3.small.x86"
    assert active.operating_system.slug == "debian_12"
    assert active.metro.code == "sv"
    assert active.customdata == {"team": "blue"}
    assert active.ip_addresses and active.ip_addresses[0].address
    assert active.userdata.startswith("#cloud-config")
    step("active")

    # The project names its device.
    hrefs = [d.href for d in projects.find_project_by_id(project).devices]
    assert hrefs == [f"/metal/v1/devices/{device_id}"], hrefs
    listed = devices.find_project_devices(project)
    assert [str(d.id) for d in listed.devices] == [device_id]
    assert listed.meta.total == 1 and listed.meta.next is None
    assert len(devices.find_project_devices_all_pages(project).devices) == 1
    step("list")

    updated = devices.update_device(
        device_id, metal.DeviceUpdateInput(description="updated", tags=["sdk", "web"])
    )
    assert updated.description == "updated" and updated.tags == ["sdk", "web"]
    step("update")

    devices.perform_action(device_id, metal.DeviceActionInput(type="reboot"))
    time.sleep(1)
    wait(["active"], ["active"])
    step("reboot")

    devices.perform_action(device_id, metal.DeviceActionInput(type="reinstall"))
    wait(["reinstalling"], ["active", "reinstalling"])
    wait(["active"], ["reinstalling"])
    step("reinstall")

    device_events = events.find_device_events(device_id)
    kinds = [e.type for e in device_events.events]
    assert "instance.created" in kinds and "instance.reinstall" in kinds, kinds
    assert events.find_event_by_id(str(device_events.events[0].id)).id
    assert len(events.find_project_events_all_pages(project).events) >= len(kinds)
    step("events")
    assert reservations.find_project_hardware_reservations(project).meta.total is not None
    step("reservations")

    devices.delete_device(device_id)
    deadline = time.monotonic() + TIMEOUT
    while True:
        try:
            d = devices.find_device_by_id(device_id)
        except NotFoundException:
            break
        assert d.state == "deprovisioning", d.state
        if seen[-1] != d.state:
            seen.append(d.state)
        assert time.monotonic() < deadline, f"device {device_id} not gone"
        time.sleep(0.5)
    assert devices.find_project_devices(project).meta.total == 0
    assert projects.find_project_by_id(project).devices == []
    step("delete")

    print(json.dumps({"device": device_id, "states": seen, "done": done}))


if __name__ == "__main__":
    main()
