/* One approval request: Approve (a), Reject with a reason (r), Reject and roll back, Extend.
 * Decisions go through the API; the decision panel is re-rendered by the server when any
 * reviewer decides, so everyone sees who decided. */
(function () {
  "use strict";
  var UL = window.UL;
  var holder = document.querySelector(".decision-card");
  var refresh = UL.refresher(holder);

  function live() { return document.getElementById("approval-live"); }
  function id() { return live().dataset.id; }
  function pending() { return live().dataset.state === "pending"; }

  function afterDecision(data) {
    refresh();
    return data;
  }

  /* The reviewer's edit of the args, if they opened the editor and changed them: undefined for
   * none, null if it is not a JSON object (said next to the editor; nothing is sent). */
  function editedArgs() {
    var editor = document.getElementById("args-editor");
    var status = document.getElementById("args-editor-status");
    if (!editor || !document.getElementById("edit-args").open || editor.value === editor.defaultValue) return undefined;
    var value;
    try { value = JSON.parse(editor.value); } catch (err) { value = err; }
    if (value === null || typeof value !== "object" || Array.isArray(value) || value instanceof Error) {
      status.textContent = "Not a JSON object: " + (value instanceof Error ? value.message : "write {\"name\": value, …}") + ".";
      status.className = "small error-text";
      editor.focus();
      return null;
    }
    status.textContent = "";
    return value;
  }

  /* Approve (with the edit, if any); `then` follows only a successful approval (a grant). */
  function approve(button, then) {
    button = button || document.getElementById("approve-button");
    if (!button || !pending()) return;
    var args = editedArgs();
    if (args === null) return;
    var body = {args_digest: live().dataset.digest};
    if (args !== undefined) body.args = args;
    UL.act(button, function () {
      return UL.api("POST", "/api/v1/approvals/" + id() + "/approve", body).then(function (data) {
        var still = data && data.approval && data.approval.state === "pending";
        // A grant follows only a decided approval (a request that needs more approvers is no grant's).
        return then && !still ? then().then(function () { return data; }) : data;
      });
    }).then(function (data) {
      // With a quorum the request may still be pending: say how far it has come.
      var approval = (data && data.approval) || {};
      UL.flash(approval.state === "pending" ? "Approval recorded: " + approval.quorum + "; another reviewer must approve."
               : args !== undefined ? "Approved with your edited arguments."
               : then ? "Approved, and granted." : "Approved.", "ok");
      return afterDecision(data);
    }, function () { refresh(); });
  }

  function grant(extra) {
    var data = live().dataset;
    var body = {agent: data.agent, tool: data.tool};
    Object.keys(extra).forEach(function (key) { body[key] = extra[key]; });
    return function () { return UL.api("POST", "/api/v1/grants", body); };
  }

  function reject(rollback) {
    var input = document.getElementById("reject-reason");
    if (!input || !pending()) return;
    var reason = input.value.trim();
    if (!reason) {
      UL.flash("Write a reason to reject: the agent is told it.", "error");
      input.focus();
      return;
    }
    var button = document.getElementById(rollback ? "reject-rollback-button" : "reject-button");
    UL.act(button, function () {
      return UL.api("POST", "/api/v1/approvals/" + id() + "/reject" + (rollback ? "?rollback=true" : ""),
                    {reason: reason});
    }, rollback ? "Rejected; the run is being rolled back." : "Rejected.").then(afterDecision, function () { refresh(); });
  }

  function extend(event) {
    event.preventDefault();
    var minutes = parseInt(document.getElementById("extend-minutes").value, 10);
    UL.act(document.getElementById("extend-button"), function () {
      return UL.api("POST", "/api/v1/approvals/" + id() + "/extend", {minutes: minutes});
    }, "Deadline extended.").then(afterDecision, function () {});
  }

  holder.addEventListener("click", function (event) {
    var target = event.target.closest("button");
    if (!target) return;
    if (target.id === "approve-button") approve(target);
    if (target.id === "approve-run-button") approve(target, grant({session: live().dataset.session}));
    if (target.id === "approve-minutes-button") {
      approve(target, grant({minutes: parseInt(document.getElementById("grant-minutes").value, 10)}));
    }
    if (target.id === "reject-rollback-button") reject(true);
  });
  holder.addEventListener("submit", function (event) {
    if (event.target.id === "reject-form") {
      event.preventDefault();
      reject(false);
    }
    if (event.target.id === "extend-form") extend(event);
  });

  document.addEventListener("keydown", function (event) {
    if (event.altKey || event.ctrlKey || event.metaKey) return;
    var tag = (event.target.tagName || "").toLowerCase();
    if (tag === "input" || tag === "textarea" || tag === "select" || event.target.isContentEditable) return;
    if (document.getElementById("confirm-dialog").open) return;
    var next = document.getElementById("next-pending");
    if (event.key === "n" && next && !pending()) {
      event.preventDefault();
      location.href = next.href;
      return;
    }
    if (!pending()) return;
    if (event.key === "a") {
      event.preventDefault();
      approve();
    } else if (event.key === "r") {
      event.preventDefault();
      var input = document.getElementById("reject-reason");
      if (input && input.value.trim()) reject(false);
      else if (input) input.focus();
    }
  });

  holder.addEventListener("ul:refreshed", function () {
    var fresh = document.getElementById("approval-history-fresh");
    var history = document.getElementById("approval-history");
    if (fresh && history) {
      history.textContent = "";
      history.appendChild(fresh.content.cloneNode(true));
    }
    var state = live().dataset.state;
    var editor = document.getElementById("edit-args");
    if (editor && state !== "pending") editor.hidden = true;  // decided: nothing left to edit
    var badge = document.getElementById("approval-state");
    badge.textContent = state;
    badge.className = "state state-" + state;
  });

  function mine(payload) {
    var approval = payload.approval || (payload.data && payload.data.approval) || {};
    return approval.id === id();
  }
  ["approval.decided", "approval.expired", "approval.extended", "approval.counted"].forEach(function (kind) {
    UL.on(kind, function (payload) { if (mine(payload)) refresh(); });
  });
  // The effect moves on after the decision (executing, committed): its history card follows.
  UL.on("session.updated", function (payload) {
    var effect = live().dataset.effect;
    if ((payload.changes || []).some(function (c) { return c.what === "effect" && c.id === effect; })) refresh();
  });
  UL.onConnect(function (reconnected) { if (reconnected) refresh(); });
})();
