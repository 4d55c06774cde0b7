/* The Rules page: edit a rule (admins), try a condition against the last 7 days (reviewers). */
(function () {
  "use strict";
  var UL = window.UL;
  var form = document.getElementById("rule-form");
  var rows = document.getElementById("rule-rows");

  function field(name) { return form ? form.elements[name] : null; }
  function value(name) { var el = field(name); return el ? el.value.trim() : ""; }

  function showApprovers() {
    var require = value("outcome") === "require";
    document.getElementById("approvals-field").hidden = !require;
    document.getElementById("group-field").hidden = !require;
  }

  function conditionError(err) {
    var box = document.getElementById("condition-error");
    var body = (err && err.body) || {};
    var bad = body.error === "invalid_condition";
    box.hidden = !bad;
    box.textContent = bad ? body.message : "";
    field("condition").classList.toggle("invalid", bad);
    if (bad && body.line) focusAt(body.line, body.column);
  }

  // Put the caret where the parser stopped, so the error is where one looks.
  function focusAt(line, column) {
    var area = field("condition");
    var lines = area.value.split("\n");
    var offset = 0;
    for (var n = 0; n < line - 1 && n < lines.length; n++) offset += lines[n].length + 1;
    offset += Math.max(0, (column || 1) - 1);
    area.focus();
    area.setSelectionRange(offset, offset);
  }

  function body() {
    // The condition as typed (not trimmed): the server's line and column must point into this text.
    var data = {condition: field("condition").value, outcome: value("outcome"), agent: value("agent") || null,
                tool: value("tool") || null};
    if (data.outcome === "require") data.approvals_required = parseInt(value("approvals_required"), 10) || 2;
    return data;
  }

  function saved() {
    // What a save sends beyond the trial's fields: a group only with require (null clears it).
    var data = body();
    data.reviewer_group = data.outcome === "require" ? value("reviewer_group") || null : null;
    return data;
  }

  function trial() {
    var data = body();
    var ask = {condition: data.condition, outcome: data.outcome, days: 7, agent: data.agent, tool: data.tool};
    UL.act(document.getElementById("trial-button"), function () {
      return UL.api("POST", "/api/v1/rules/trial", ask);
    }).then(function (result) { conditionError(null); showTrial(result); }, conditionError);
  }

  function showTrial(result) {
    var c = result.counts;
    document.getElementById("trial-result").hidden = false;
    document.getElementById("trial-counts").textContent =
      "Of " + c.requests + " requests in the last " + result.days + " days, this rule would have approved " +
      c.approved + ", denied " + c.denied + " and left " + c.left_to_people + " to people" +
      (c.errors ? " (" + c.errors + " could not be evaluated)" : "") + ".";
    document.getElementById("trial-disagreements").textContent =
      "People rejected " + c.approved_but_people_rejected + " of those it would approve and approved " +
      c.denied_but_people_approved + " of those it would deny.";
    var holder = document.getElementById("trial-examples");
    holder.textContent = "";
    ["approved", "denied", "left_to_people"].forEach(function (bucket) {
      var items = result.examples[bucket];
      if (!items.length) return;
      var title = document.createElement("h3");
      title.textContent = bucket.replace(/_/g, " ") + " (examples)";
      holder.appendChild(title);
      var list = document.createElement("ul");
      list.className = "trial-examples trial-" + bucket;
      items.forEach(function (item) {
        var li = document.createElement("li");
        var link = document.createElement("a");
        link.href = "/approvals/" + item.approval + "/";
        link.textContent = item.tool + " by " + item.agent;
        var args = document.createElement("code");
        args.textContent = JSON.stringify(item.args);
        var state = document.createElement("small");
        state.className = "muted";
        state.textContent = " people: " + item.state + (item.decided_by ? " (" + item.decided_by + ")" : "");
        li.appendChild(link);
        li.appendChild(document.createTextNode(" "));
        li.appendChild(args);
        li.appendChild(state);
        list.appendChild(li);
      });
      holder.appendChild(list);
    });
  }

  function save(event) {
    event.preventDefault();
    var data = saved();
    data.name = value("name");
    data.mode = value("mode");
    data.message = value("message");
    if (value("position") !== "") data.position = parseInt(value("position"), 10);
    var id = value("id");
    UL.act(document.getElementById("save-rule"), function () {
      return UL.api(id ? "PATCH" : "POST", "/api/v1/rules" + (id ? "/" + id : ""), data);
    }, id ? "Rule saved." : "Rule added.").then(function () { window.location.reload(); }, conditionError);
  }

  function edit(rule) {
    ["id", "name", "condition", "outcome", "approvals_required", "mode", "position", "message"].forEach(function (name) {
      if (field(name)) field(name).value = rule[name] === null || rule[name] === undefined ? "" : rule[name];
    });
    field("agent").value = rule.agent || "";
    field("tool").value = rule.tool || "";
    field("reviewer_group").value = rule.reviewer_group || "";
    document.getElementById("editor-title").textContent = "Edit rule " + rule.name;
    document.getElementById("new-rule").hidden = false;
    showApprovers();
    form.scrollIntoView({behavior: "smooth"});
  }

  if (form) {
    field("outcome").addEventListener("change", showApprovers);
    showApprovers();
    document.getElementById("trial-button").addEventListener("click", trial);
    form.addEventListener("submit", save);
    var fresh = document.getElementById("new-rule");
    if (fresh) fresh.addEventListener("click", function () {
      form.reset();
      field("id").value = "";
      fresh.hidden = true;
      document.getElementById("editor-title").textContent = "New rule";
      showApprovers();
    });
  }

  // Reviewer groups (admins): create, edit members, delete.
  var groupForm = document.getElementById("group-form");
  function groupField(name) { return groupForm.elements[name]; }

  function saveGroup(event) {
    event.preventDefault();
    var id = groupField("id").value;
    var members = Array.prototype.filter.call(groupForm.querySelectorAll("input[name=members]"),
      function (box) { return box.checked; }).map(function (box) { return box.value; });
    var data = {name: groupField("name").value.trim(), description: groupField("description").value.trim(),
                members: members};
    UL.act(document.getElementById("save-group"), function () {
      return UL.api(id ? "PATCH" : "POST", "/api/v1/reviewer-groups" + (id ? "/" + id : ""), data);
    }, id ? "Group saved." : "Group added.").then(function () { window.location.reload(); }, function () {});
  }

  function editGroup(group) {
    groupField("id").value = group.id;
    groupField("name").value = group.name;
    groupField("description").value = group.description || "";
    groupForm.querySelectorAll("input[name=members]").forEach(function (box) {
      box.checked = group.members.indexOf(box.value) >= 0;
    });
    document.getElementById("new-group").hidden = false;
    groupForm.scrollIntoView({behavior: "smooth"});
  }

  if (groupForm) {
    groupForm.addEventListener("submit", saveGroup);
    document.getElementById("new-group").addEventListener("click", function () {
      groupForm.reset();
      groupField("id").value = "";
      document.getElementById("new-group").hidden = true;
    });
    document.getElementById("group-rows").addEventListener("click", function (event) {
      var button = event.target.closest("button[data-action]");
      if (!button) return;
      var group = JSON.parse(button.closest("li").dataset.json);
      if (button.dataset.action === "edit-group") editGroup(group);
      if (button.dataset.action === "delete-group" && window.confirm("Delete the reviewer group " + group.name + "?")) {
        UL.act(button, function () { return UL.api("DELETE", "/api/v1/reviewer-groups/" + group.id); }, "Group deleted.")
          .then(function () { window.location.reload(); }, function () {});
      }
    });
  }

  rows.addEventListener("click", function (event) {
    var button = event.target.closest("button[data-action]");
    if (!button) return;
    var row = button.closest("tr");
    var rule = JSON.parse(row.dataset.json);
    if (button.dataset.action === "edit-rule") edit(rule);
    if (button.dataset.action === "delete-rule" && window.confirm("Delete the rule " + rule.name + "?")) {
      UL.act(button, function () { return UL.api("DELETE", "/api/v1/rules/" + rule.id); }, "Rule deleted.")
        .then(function () { window.location.reload(); }, function () {});
    }
  });
})();
