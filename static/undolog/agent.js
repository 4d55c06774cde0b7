/* One agent's page: the fleet rollback since a date and time typed in the organization's time
 * zone (not the browser's), its preview, a person's confirmation with a reason, then the entries
 * left until the walks are done. Everything acts through the API; the server re-renders after. */
(function () {
  "use strict";
  var UL = window.UL;
  var holder = document.getElementById("agent-live");
  var name = holder.dataset.agent;
  var refresh = UL.refresher(holder);
  var path = "/api/v1/agents/" + encodeURIComponent(name) + "/rollback";

  ["agent.suspended", "agent.resumed", "incident.changed", "budget.exceeded", "agent.rolled_back"].forEach(function (kind) {
    UL.on(kind, refresh);
  });
  UL.onConnect(function (reconnected) { if (reconnected) refresh(); });

  /* Minutes east of UTC that `zone` is at the instant `ms`. */
  function offsetAt(ms, zone) {
    var parts = {};
    new Intl.DateTimeFormat("en-US", {timeZone: zone, hourCycle: "h23", year: "numeric", month: "2-digit",
      day: "2-digit", hour: "2-digit", minute: "2-digit", second: "2-digit"}).formatToParts(new Date(ms))
      .forEach(function (part) { parts[part.type] = part.value; });
    var wall = Date.UTC(+parts.year, +parts.month - 1, +parts.day, +parts.hour % 24, +parts.minute, +parts.second);
    return Math.round((wall - Math.floor(ms / 1000) * 1000) / 60000);
  }

  /* "YYYY-MM-DDTHH:MM" on the clocks of `zone` as an instant (ms). The offset is read twice: at
   * the first guess, then at the instant it gives, so a time across a DST change from now still
   * lands right. */
  function zonedToInstant(value, zone) {
    var m = /^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2})/.exec(value);
    if (!m) return null;
    var wall = Date.UTC(+m[1], +m[2] - 1, +m[3], +m[4], +m[5]);
    var first = wall - offsetAt(wall, zone) * 60000;
    return wall - offsetAt(first, zone) * 60000;
  }

  var form = document.getElementById("rollback-form");
  if (form) {
    form.addEventListener("submit", function (event) {
      event.preventDefault();
      var zone = form.dataset.zone;
      var typed = document.getElementById("rollback-since").value;
      var instant = zonedToInstant(typed, zone);
      if (instant === null) { UL.flash("Give a date and a time.", "error"); return; }
      var since = new Date(instant).toISOString();
      var shown = typed.replace("T", " ") + " " + zone;
      var button = document.getElementById("rollback-submit");
      UL.api("GET", path + "?since=" + encodeURIComponent(since)).then(function (plan) {
        return UL.confirm({
          title: "Roll back " + plan.runs + " run" + (plan.runs === 1 ? "" : "s") + " of " + name + "?",
          body: "Fails its " + plan.running + " running run" + (plan.running === 1 ? "" : "s") + " and undoes the " +
                plan.ended + " that ended since " + shown + ": " + plan.entries + " undo entr" +
                (plan.entries === 1 ? "y" : "ies") + " compensated, newest first within each run. It cannot be taken back.",
          confirm: "Roll back " + plan.runs + " run" + (plan.runs === 1 ? "" : "s"),
          input: {label: "Reason", required: true}
        });
      }).then(function (reason) {
        if (reason === null || reason === undefined) return;
        UL.act(button, function () { return UL.api("POST", path, {since: since, reason: reason}); }, null)
          .then(function (answer) {
            UL.flash(name + ": " + answer.runs + " runs rolled back, " + answer.entries + " undo entries to walk.", "ok");
            refresh();
            watch();
          }, function () {});
      }, function (error) { UL.flash((error && error.message) || "Could not read what the rollback would take.", "error"); });
    });
  }

  var watching = false;

  function watch() {
    if (watching) return;
    watching = true;
    UL.follow(path, function (answer) {
      if (!answer) { watching = false; return false; }
      var left = answer.in_progress;
      var line = document.getElementById("rollback-progress");
      if (line) {
        line.hidden = left.entries_left === 0;
        line.dataset.entriesLeft = left.entries_left;
        document.getElementById("rollback-entries").textContent = left.entries_left;
        document.getElementById("rollback-runs").textContent = left.runs;
      }
      if (left.entries_left > 0) return true;
      watching = false;
      refresh();
      return false;
    });
  }

  // A rollback already under way when the page loads (or started elsewhere): follow it.
  function followRunning() {
    var line = document.getElementById("rollback-progress");
    if (line && parseInt(line.dataset.entriesLeft || "0", 10) > 0) watch();
  }
  followRunning();
  holder.addEventListener("ul:refreshed", followRunning);
})();
