/* A session page: the server re-renders the timeline, undo stack and budget bars when this run
 * changes. `session.updated` (a run, one of its effects or undo entries moved; coalesced by the
 * server) and every event that names this run trigger one re-render; on every reconnect the
 * page re-reads, since messages sent while the socket was down are lost. No polling.
 * Buttons: fail and roll back (reviewer), undo a completed run (admin), and "Roll back to here"
 * on a step or a savepoint (reviewer): the API's preview in a confirmation, a reason, then the
 * rewind, followed until the run runs again. */
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
    if (button.classList.contains("rewind-button")) rewindTo(button);
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

  var rewindPath = "/api/v1/sessions/" + id + "/rewind";

  function el(tag, text, attrs) {
    var node = document.createElement(tag);
    if (text) node.textContent = text;
    Object.keys(attrs || {}).forEach(function (name) { node.setAttribute(name, attrs[name]); });
    return node;
  }

  function callList(items, listId) {
    var list = el("ul", "", {"class": "undo-list", id: listId});
    items.forEach(function (item) {
      var li = el("li", "step " + item.step_index + ": ");
      li.appendChild(el("strong", item.tool));
      li.appendChild(document.createTextNode(" · " + item.state + " · " + UL.formatTime(item.at)));
      list.appendChild(li);
    });
    return list;
  }

  function plural(n, one, many) { return n + " " + (n === 1 ? one : many); }

  /* What the preview says the rewind will do: undone (newest first), left done, withdrawn. */
  function rewindBody(plan) {
    var body = el("div");
    if (plan.to_undo.length) {
      body.appendChild(el("p", "It undoes " + plural(plan.to_undo.length, "call", "calls") +
        " made after step " + plan.to_step + ", newest first:"));
      body.appendChild(callList(plan.to_undo, "rewind-undo"));
    } else {
      body.appendChild(el("p", "No compensable call after step " + plan.to_step + " is left to undo."));
    }
    if (plan.left_done.length) {
      body.appendChild(el("p", plural(plan.left_done.length, "irreversible call", "irreversible calls") +
        " after the step cannot be undone:"));
      body.appendChild(callList(plan.left_done, "rewind-left"));
      var label = el("label", "", {"class": "rewind-leave"});
      label.appendChild(el("input", "", {type: "checkbox", id: "rewind-leave-input"}));
      label.appendChild(el("span", "Leave them done and roll back anyway (the run's history lists them as not undone)."));
      body.appendChild(label);
    }
    if (plan.withdrawn.length) {
      body.appendChild(el("p", plural(plan.withdrawn.length, "request", "requests") +
        " waiting for a reviewer after the step will be withdrawn:"));
      body.appendChild(callList(plan.withdrawn, "rewind-withdrawn"));
    }
    body.appendChild(el("p", "The run goes on from step " + plan.to_step + " once the walk is done. " +
      "Budgets are not refunded.", {"class": "muted small"}));
    return body;
  }

  /* A refused rewind, in words a reviewer can act on. */
  function refusal(error) {
    var body = error.body || {};
    var code = body.error;
    if (code === "irreversible_in_the_way") {
      return "Not rolled back: irreversible calls after step " + body.to_step + " cannot be undone (" +
        (body.irreversible || []).map(function (i) { return i.tool + " at step " + i.step_index; }).join(", ") +
        "). Tick \u201cleave them done\u201d to roll back anyway.";
    }
    if (code === "rewind_in_progress") {
      return "Not rolled back: the run is being rolled back to step " + body.to_step + " already; try again once it runs.";
    }
    return "Not rolled back: " + error.message;  // walk_stopped names the failed compensation
  }

  /* A step, or a savepoint (by its name: the rewind's record names it). */
  function rewindTo(button) {
    var step = parseInt(button.dataset.step, 10);
    var name = button.dataset.savepoint;
    var target = name ? "?to=" + encodeURIComponent(name) : "?to_step=" + step;
    var where = "step " + step + (name ? " (savepoint \u201c" + name + "\u201d)" : "");
    var leave = null;
    UL.api("GET", rewindPath + target).then(function (plan) {
      var body = rewindBody(plan);
      leave = body.querySelector("#rewind-leave-input");
      return UL.confirm({title: "Roll the run back to " + where + "?", body: body,
                         confirm: "Roll back to step " + step, input: {label: "Reason", required: true}});
    }).then(function (reason) {
      if (reason === null || reason === undefined) return;
      var payload = name ? {to: name, reason: reason} : {to_step: step, reason: reason};
      if (leave) payload.leave_irreversible = leave.checked;
      button.disabled = true;
      UL.api("POST", rewindPath, payload).then(function (answer) {
        UL.flash("Rolling back to step " + answer.resumes_at + ": " + plural(answer.counts.to_undo, "call", "calls") +
          " to undo" + (answer.counts.left_done ? ", " + answer.counts.left_done + " left done" : "") + ".", "ok");
        refresh();
        watch();
      }, function (error) {
        button.disabled = false;
        UL.flash(refusal(error), "error");
      });
    }, function (error) { UL.flash(refusal(error), "error"); });
  }

  /* The rewind under way: the undo entries it has left, until the run runs again (or its walk
   * stops on a failed compensation: the page says so, and a person retries or resolves it). */
  var watching = false;

  function watch() {
    if (watching) return;
    watching = true;
    UL.follow(rewindPath, function (answer) {
      var left = answer && answer.in_progress;
      var line = document.getElementById("rewind-progress");
      if (left && line) {
        line.hidden = false;
        line.dataset.entriesLeft = left.entries_left;
        document.getElementById("rewind-to").textContent = left.to_step;
        document.getElementById("rewind-entries").textContent = left.entries_left;
      }
      if (left && left.state === "compensating") return true;
      watching = false;
      refresh();
      return false;
    });
  }

  function followRunning() {
    var summary = document.getElementById("session-summary");
    var line = document.getElementById("rewind-progress");
    if (summary && summary.dataset.state === "compensating" && line && !line.hidden) watch();
  }
  followRunning();
  holder.addEventListener("ul:refreshed", followRunning);
})();
