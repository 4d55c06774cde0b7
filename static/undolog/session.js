/* A session page: the server re-renders the timeline, undo stack and budget bars when this run
 * changes. `session.updated` (a run, one of its effects or undo entries moved; coalesced by the
 * server) and every event that names this run trigger one re-render; on every reconnect the
 * page re-reads, since messages sent while the socket was down are lost. No polling.
 * Buttons: fail and roll back (reviewer), undo a completed run (admin). */
(function () {
  "use strict";
  var UL = window.UL;
  var holder = document.getElementById("session-live");
  var id = holder.dataset.id;
  var refresh = UL.refresher(holder);

  UL.on("*", function (payload) {
    if (payload.session === id) refresh();
  });
  UL.onConnect(function (reconnected) { if (reconnected) refresh(); });
  holder.addEventListener("ul:refreshed", function () {
    holder.dataset.updated = String(Date.now());  // when the page last caught up (tests read it)
  });

  holder.addEventListener("click", function (event) {
    var button = event.target.closest("button");
    if (!button) return;
    if (button.id === "fail-button") failRun(button);
    if (button.id === "undo-button") undoRun(button);
  });

  function failRun(button) {
    UL.confirm({
      title: "Fail this run and roll it back?",
      body: "The session fails at once and its undo stack is walked back, newest first. A call waiting for approval is not run.",
      confirm: "Fail and roll back",
      input: {label: "Reason", required: true}
    }).then(function (reason) {
      if (reason === null) return;
      UL.act(button, function () {
        return UL.api("POST", "/api/v1/sessions/" + id + "/fail", {error: reason});
      }, "The run failed; rolling back.").then(refresh, function () {});
    });
  }

  function undoRun(button) {
    var body = document.getElementById("undo-confirm-body").content.cloneNode(true);
    var wrapper = document.createElement("div");
    wrapper.appendChild(body);
    UL.confirm({title: "Undo this completed run?", body: wrapper, confirm: "Undo these steps"}).then(function (ok) {
      if (!ok) return;
      UL.act(button, function () {
        return UL.api("POST", "/api/v1/sessions/" + id + "/undo", {});
      }, "Undoing the run.").then(refresh, function () {});
    });
  }
})();
