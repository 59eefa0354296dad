"""The README walkthrough in a real browser: headless Chromium driving the Dagster UI as a person would.

Dagster's webserver and daemon as the demo runs them, two Spark-less worker
nodes (`laminar_dev.arrownode`) with partitions 0 and 1 on node 1, a load. In
the browser: the Launchpad of ``migrate_partition`` guides (its error for the
empty config suggests nothing invalid), the config typed into its editor and
Launch Run move partition 0 to node 2; then node 1 is killed (SIGKILL) and the
Catalog shows, on ``ownership_map``, the dead owner ("owner dead: failover
pending") and the failed ``partitions_on_live_nodes`` check the failure sensor
recorded when it found the owner dead — before the failover ended — and the
passing check after it; ``laminar status`` calls node 1 dead, and the output
table the nodes append to shows as observed (``stream_output``). Every page is saved as a screenshot for a person to
look at (the directory is printed). Waiting for state uses the ledger and the
Dagster instance; what is asserted is what the UI shows.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from dagster import DagsterEventType, DagsterRunStatus, EventLogRecord, EventRecordsFilter

from laminar_dev.localcluster import Cluster, NodeProcess, wait_until
from laminar_orchestration.identity import PartitionId
from laminar_orchestration.protocol.desired_states import DesiredStates
from tests.dagster_plane import ControlPlane, bring_up, failed_over

pytestmark = [pytest.mark.dagster, pytest.mark.processes, pytest.mark.slow]

HEARTBEAT_TIMEOUT_S = 3.0
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
#: Where a run leaves its screenshots when LAMINAR_SCREENSHOTS is unset: beside the test's temporary files.
SCREENSHOTS_ENV = "LAMINAR_SCREENSHOTS"
#: Longest a page may take to show what is asked of it (a loaded CI machine renders slowly).
PAGE_TIMEOUT_S = 60.0

if CHROMIUM is None or CHROMEDRIVER is None:
    # CI installs them (scripts/test.sh): a missing browser there is a failure, not a skip.
    if os.environ.get("CI"):
        raise RuntimeError("chromium and chromedriver are required on CI (scripts/test.sh installs them)")
    pytestmark.append(pytest.mark.skip(reason="chromium and chromedriver are not installed"))

if TYPE_CHECKING:  # selenium is a dev dependency: imported where it is used
    from selenium.webdriver.remote.webdriver import WebDriver


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[WebDriver]:
    """Headless Chromium with a fresh profile, no network of its own beyond the page asked for."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    profile = tempfile.mkdtemp(prefix="chromium-", dir=tmp_path)
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--window-size=1440,1000",
    ):
        options.add_argument(flag)
    assert CHROMIUM is not None and CHROMEDRIVER is not None
    options.binary_location = CHROMIUM
    driver = webdriver.Chrome(
        service=Service(CHROMEDRIVER, log_output=str(tmp_path / "chromedriver.log")), options=options
    )
    driver.set_page_load_timeout(PAGE_TIMEOUT_S)
    try:
        yield driver
    finally:
        driver.quit()


class Screens:
    """Numbered screenshots of each step, in one directory a person can open."""

    def __init__(self, driver: WebDriver, directory: Path) -> None:
        self.driver = driver
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.count = 0

    def shoot(self, name: str) -> Path:
        self.count += 1
        path = self.directory / f"{self.count:02d}-{name}.png"
        self.driver.save_screenshot(str(path))
        return path


def page_text(driver: WebDriver) -> str:
    from selenium.webdriver.common.by import By

    return str(driver.find_element(By.TAG_NAME, "body").text)


def wait_for_text(driver: WebDriver, *needles: str, timeout: float = PAGE_TIMEOUT_S) -> str:
    """The page's text once it shows every one of `needles`."""
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        text = page_text(driver)
        if all(n in text for n in needles):
            return text
        time.sleep(0.25)
    raise AssertionError(f"the page never showed {needles}; it shows:\n{text[-3000:]}")


def click_text(driver: WebDriver, text: str, tag: str = "*") -> None:
    """Click the (first visible) element whose own text is `text`."""
    from selenium.webdriver.common.by import By

    def clickable() -> bool:
        for element in driver.find_elements(By.XPATH, f"//{tag}[normalize-space(text())='{text}']"):
            if element.is_displayed() and element.is_enabled():
                element.click()
                return True
        return False

    wait_until(clickable, PAGE_TIMEOUT_S, f"a clickable {text!r}", interval=0.25)


def start_arrow_node(cluster: Cluster, node: int, workdir: Path) -> None:
    """A worker node process without Spark (starts in a second), heartbeating every 0.5 s."""
    log = workdir / f"node{node}.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "laminar_dev.arrownode", "--store", cluster.store_url, "--node-id", str(node),
             "--heartbeat-timeout", str(HEARTBEAT_TIMEOUT_S), "--table-sync-interval", "1"],
            stdout=fh, stderr=subprocess.STDOUT,
        )  # fmt: skip
    cluster.nodes[node] = NodeProcess(node, proc, log)


def type_config(driver: WebDriver, lines: list[str]) -> str:
    """Type `lines` into the Launchpad's config editor (CodeMirror) as a person would; its content."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    editor = driver.find_element(By.CSS_SELECTOR, ".CodeMirror")
    editor.click()
    actions = ActionChains(driver).key_down(Keys.CONTROL).send_keys("a").key_up(Keys.CONTROL).send_keys(Keys.DELETE)
    for i, line in enumerate(lines):
        if i:
            actions = actions.send_keys(Keys.ENTER)
        # Escape closes the editor's completion list, so the next Enter starts a line instead of picking one.
        actions = actions.send_keys(line).pause(0.3).send_keys(Keys.ESCAPE)
    actions.perform()
    return str(driver.execute_script("return document.querySelector('.CodeMirror').CodeMirror.getValue()"))


def test_the_readme_walkthrough_in_a_browser(tmp_path: Path, browser: WebDriver) -> None:
    shots = Screens(browser, Path(os.environ.get(SCREENSHOTS_ENV) or tmp_path / "screenshots"))
    print(f"screenshots: {shots.directory}")
    store_url = (tmp_path / "store").as_uri()
    cluster = Cluster(store_url, tmp_path, partitions=2, heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S)
    plane = ControlPlane(tmp_path, store_url, heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S)
    try:
        bring_up(
            plane, cluster, lambda node: start_arrow_node(cluster, node, tmp_path), {0: 1, 1: 1}, alive_timeout_s=120
        )
        ui = f"http://127.0.0.1:{plane.port}"

        # 1. The Launchpad guides: the one required field first, and an empty config's error suggests
        #    only a valid value (no `to_node: 0`, which is no node).
        browser.get(f"{ui}/locations/laminar/jobs/migrate_partition/playground")
        text = wait_for_text(browser, "Launch Run", "Missing required config entry")
        shots.shoot("launchpad-empty")
        assert "{'partition': 0}" in text and "'to_node': 0" not in text, text[-2000:]
        hint = text[text.index("partition: Int") :]
        assert hint.index("partition: Int") < hint.index("to_node?") < hint.index("tuning?"), hint[:1500]
        typed = type_config(browser, ["partition: 0", "to_node: 2"])
        assert typed.split() == ["partition:", "0", "to_node:", "2"], typed
        wait_for_text(browser, "No errors")
        shots.shoot("launchpad-config")
        click_text(browser, "Launch Run")
        wait_until(lambda: "/runs/" in browser.current_url, PAGE_TIMEOUT_S, "the run's page")
        run_id = browser.current_url.split("/runs/")[1].split("?")[0].strip("/")
        run = plane.wait_finished(run_id)
        assert run.status == DagsterRunStatus.SUCCESS, run
        assert cluster.owner(0) == 2
        browser.refresh()
        text = wait_for_text(browser, "migrate_partition", "activate", "Success")
        shots.shoot("migration-run")

        # 2. Kill node 1, the owner of partition 1: the sensor fails it over to node 2.
        epoch = cluster.epoch(1)
        cluster.kill(1)
        wait_until(lambda: failed_over(cluster, 1, 2), 60, "partition 1 failed over to node 2")
        task = DesiredStates(cluster.ledger).read(PartitionId(1))[0].migration
        assert task is not None and task.completed_at is not None and task.from_epoch == epoch
        # `laminar status` in a shell agrees: node 1 is dead, its last request rate not shown as current.
        status = subprocess.run(
            [sys.executable, "-m", "laminar_orchestration.cli", "status", "--store", store_url],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        killed = next(line.split() for line in status.stdout.splitlines() if line.split()[:2] == ["1", "1"])
        assert killed[2] == "NO" and killed[4:] == ["-", "dead"], status.stdout

        # What the instance recorded (to find it in the UI, and to know when it was recorded): the sensor
        # reports the healthy map and the passing check with its result, a moment after the failover.
        def evaluations() -> list[EventLogRecord]:
            with plane.instance() as instance:
                return list(
                    instance.event_log_storage.get_event_records(
                        EventRecordsFilter(event_type=DagsterEventType.ASSET_CHECK_EVALUATION), limit=50
                    )
                )

        def passed(record: EventLogRecord) -> bool:
            return bool(record.event_log_entry.dagster_event.event_specific_data.passed)  # type: ignore[union-attr]

        wait_until(lambda: passed(evaluations()[0]), 60, "the passing check after the failover", interval=0.5)
        failed = [
            r
            for r in evaluations()
            if not passed(r) and "owner dead" in (r.event_log_entry.dagster_event.event_specific_data.description or "")  # type: ignore[union-attr]
        ]
        assert failed, "no failing check recorded for the dead owner"
        # Recorded when the death was detected: before the failover it announced had ended.
        assert min(r.timestamp for r in failed) < task.completed_at.timestamp()

        # 3. The Catalog: the check's history shows the failure at detection, then the pass after the failover.
        browser.get(f"{ui}/assets/ownership_map?view=checks")
        wait_for_text(browser, "partitions_on_live_nodes", "Execution history")
        click_text(browser, "Execution history", "button")
        dead = "1 of 2 partitions not on a live node: p1 (owner dead: failover pending)"
        text = wait_for_text(browser, "Evaluation result", dead)
        shots.shoot("check-history")
        history = text[text.index("Evaluation result") :]
        # Newest first: the latest evaluation passes, and the failure at detection came before it.
        rows = [line for line in history.splitlines() if line in ("Passed", "Failed")]
        assert rows and rows[0] == "Passed", history[:1500]
        assert history.index("all 2 partitions on live nodes") < history.index(dead), history[:1500]

        # 4. The ownership map's events: the dead owner as observed at detection, then p1 on node 2.
        browser.get(f"{ui}/assets/ownership_map?view=events")
        latest = wait_for_text(browser, "Observe", f"1 {epoch + 1} 2 active true ok")
        shots.shoot("ownership-latest")
        assert "Materialize" not in latest, "an observation-only asset offers Materialize"
        assert f"1 {epoch + 1} 2 active true ok" in latest, latest[-2000:]
        found = find_event(browser, lambda t: "owner dead: failover pending" in t)
        shots.shoot("ownership-dead-owner")
        assert f"1 {epoch} 1 active false owner dead: failover pending" in found, found[-2000:]

        # 5. The failover's run says plainly that it records what the sensor drove, phase by phase.
        def recorded() -> bool:
            plane.check_running()
            runs = plane.runs("failover_partition")
            return len(runs) == 1 and runs[0].is_finished

        wait_until(recorded, 120, "the failover_partition run", interval=0.5)
        (failover_run,) = plane.runs("failover_partition")
        assert failover_run.status == DagsterRunStatus.SUCCESS, failover_run
        browser.get(f"{ui}/runs/{failover_run.run_id}")
        wait_for_text(browser, "failover_partition", f"records failover {task.migration_id}", "node_failure_sensor")
        shots.shoot("failover-run")

        # 6. The observation-only asset's button works: Observe reads the ledger in a run of its own.
        before = {r.run_id for r in plane.runs()}
        browser.get(f"{ui}/assets/ownership_map")
        wait_for_text(browser, "Observe", "Latest observation")
        shots.shoot("ownership-overview")
        click_text(browser, "Observe")

        def observed() -> bool:
            plane.check_running()
            new = [r for r in plane.runs() if r.run_id not in before]
            return len(new) == 1 and new[0].is_finished

        wait_until(observed, 120, "the Observe run", interval=0.5)
        (observe_run,) = [r for r in plane.runs() if r.run_id not in before]
        assert observe_run.status == DagsterRunStatus.SUCCESS, observe_run

        # 7. The output table the nodes append to is observed by the sensor, no run: never "Never observed".
        browser.get(f"{ui}/assets/stream_output")
        text = wait_for_text(browser, "Latest observation")
        shots.shoot("stream-output")
        assert "Never observed" not in text, text[-2000:]
    finally:
        plane.stop()
        cluster.shutdown()
        print(f"screenshots: {shots.directory}")


def find_event(driver: WebDriver, wanted: Callable[[str], bool], limit: int = 30) -> str:
    """Click the asset's events, newest first, until one's details satisfy `wanted`; the page's text then."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    rows = "//div[@role='img' and @aria-label='observation']/.."
    count = len(driver.find_elements(By.XPATH, rows))
    for i in range(min(count, limit)):
        for _ in range(3):  # the list re-renders when the UI polls: find the row again
            try:
                driver.find_elements(By.XPATH, rows)[i].click()
                break
            except (StaleElementReferenceException, IndexError):
                time.sleep(0.5)
        time.sleep(0.5)
        text = page_text(driver)
        if wanted(text):
            return text
    raise AssertionError(f"none of {min(count, limit)} events shows what was asked:\n{page_text(driver)[-2000:]}")
