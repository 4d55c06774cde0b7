/* Compensation failures: Retry, or Mark resolved with a note (the person undid it by hand). */
(function () {
  "use strict";
  var UL = window.UL;
  var holder = document.getElementById("failures-live");
  // An older page keeps its cursor when it refreshes itself.
  var query = new URLSearchParams(location.search);
  query.set("part", "live");
  var refresh = UL.refresher(holder, location.pathname + "?" + query.toString());

  UL.on("compensation.failed", refresh);
  // A retry or a resolution elsewhere (another reviewer, the API) takes a row off the list.
  UL.on("session.updated", function (payload) {
    var touched = (payload.changes || []).some(function (change) {
      return change.from === "compensation_failed" || change.to === "compensation_failed";
    });
    if (touched || payload.more) refresh();
  });
  UL.onConnect(function (reconnected) { if (reconnected) refresh(); });

  holder.addEventListener("click", function (event) {
    var button = event.target.closest("button[data-action]");
    if (!button) return;
    var row = button.closest("tr[data-entry]");
    var entry = row.dataset.entry;
    if (button.dataset.action === "retry") {
      UL.act(button, function () {
        return UL.api("POST", "/api/v1/undo-entries/" + entry + "/retry", {});
      }, "Retrying; the walk resumes from this step.").then(refresh, function () {});
    }
    if (button.dataset.action === "resolve") {
      UL.confirm({
        title: "Mark this compensation resolved?",
        body: "Say what you did by hand. The walk then resumes with the steps below this one.",
        confirm: "Mark resolved",
        input: {label: "Note", required: true}
      }).then(function (note) {
        if (note === null) return;
        UL.act(button, function () {
          return UL.api("POST", "/api/v1/undo-entries/" + entry + "/resolve", {note: note});
        }, "Marked resolved.").then(refresh, function () {});
      });
    }
  });
})();
