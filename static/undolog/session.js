/* A session page: the server re-renders the timeline, undo stack and budget bars when an event
 * of this run arrives, and every few seconds while the run is open (effects commit without
 * an event). Buttons: fail and roll back (reviewer), undo a completed run (admin). */
(function () {
  "use strict";
  var UL = window.UL;
  var holder = document.getElementById("session-live");
  var id = holder.dataset.id;
  var refresh = UL.refresher(holder);
  var timer = null;

  function isOpen() {
    var summary = document.getElementById("session-summary");
    return summary && summary.dataset.open === "1";
  }

  UL.on("*", function (payload) {
    if (payload.session === id) refresh();
  });
  UL.onConnect(function (reconnected) { if (reconnected) refresh(); });

  function poll() {
    clearTimeout(timer);
    timer = setTimeout(function () {
      if (isOpen() && !document.hidden) refresh();
      poll();
    }, 3000);
  }
  poll();

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
