/* The approval queue: rows arrive and leave live; on every (re)connect the pending list is
 * re-fetched from the API and the table reconciled with it, so nothing missed stays missed.
 * Filtered or paged, the table is a part of the queue: a new request joins it only if it
 * matches the filters and belongs on this page, and the count is the whole queue's (the nav's). */
(function () {
  "use strict";
  var UL = window.UL;
  var tbody = document.getElementById("queue-rows");
  var template = document.getElementById("queue-row-template");
  var filters = JSON.parse(document.getElementById("queue-filters-data").textContent);
  var nextPage = document.getElementById("next-page");
  var bar = document.getElementById("batch-bar");
  var whole = !nextPage && location.search.indexOf("after=") === -1 &&
    !Object.keys(filters).some(function (name) { return filters[name]; });
  UL.queueHasAll = whole;  // live.js leaves the nav count to this list only when it is the whole queue

  function matches(item) {
    if (filters.agent && item.agent !== filters.agent) return false;
    if (filters.tool && item.tool !== filters.tool) return false;
    if (filters.tag && (item.risk_tags || []).indexOf(filters.tag) === -1) return false;
    if (filters.age) return false;  // a request that just arrived has not waited that long
    var all = rows();
    // With a next page, a later deadline than this page's last belongs to a later page.
    if (nextPage && all.length && Date.parse(item.timeout_at) > Date.parse(all[all.length - 1].dataset.deadline)) return false;
    return true;
  }
  var soundToggle = document.getElementById("sound-toggle");
  soundToggle.checked = localStorage.getItem("undolog.sound") === "1";
  soundToggle.addEventListener("change", function () {
    localStorage.setItem("undolog.sound", soundToggle.checked ? "1" : "0");
    if (soundToggle.checked) UL.beep();
  });

  function rows() {
    return Array.prototype.slice.call(tbody.querySelectorAll("tr.queue-row"));
  }

  function rowOf(id) {
    return tbody.querySelector('tr.queue-row[data-id="' + CSS.escape(id) + '"]');
  }

  function firstLine(text) {
    text = (text || "").trim();
    var line = text ? text.split("\n")[0].trim() : "";
    return line.length > 200 ? line.slice(0, 199) + "…" : line;
  }

  /* The request's own reasoning: the API item has it; an event's approval carries the trace. */
  function reasoningOf(item) {
    if (typeof item.reasoning === "string") return firstLine(item.reasoning);
    var trace = (item.agent_context && item.agent_context.reasoning) || [];
    for (var i = trace.length - 1; i >= 0; i--) {
      if (trace[i].step_index === item.step_index) return firstLine(trace[i].text);
    }
    return "";
  }

  // "1 of 2" beside the tool while a request needs several distinct approvers.
  function showQuorum(row, item) {
    var quorum = row.querySelector(".quorum");
    var several = (item.approvals_required || 1) > 1;
    quorum.hidden = !several;
    quorum.textContent = several ? (item.approvals || []).length + " of " + item.approvals_required : "";
    var group = row.querySelector(".group");
    group.hidden = !item.reviewer_group;
    group.textContent = item.reviewer_group ? "needs " + item.reviewer_group : "";
    var why = row.querySelector(".why");
    var text = whyText(item.why || []);
    // A flagged call ran already: the reviewer decides whether it stays (reject undoes it).
    if (item.flagged) text = "flagged: ran at once, reject undoes it" + (text ? " · " + text : "");
    why.hidden = !text;
    why.textContent = text;
  }

  // The same line as the server's (approvals/events.py why_text): which argument came from which call.
  function whyText(why) {
    return why.map(function (w) {
      var unrequested = w.requested === false;
      var suffix = unrequested ? " and was not named in the user's request" : "";
      var found = (w.tainted || []).map(function (t) {
        return t.arg + " came from " + t.from_tool + " at step " + t.from_step + suffix;
      }).join("; ");
      if (!found && unrequested) {
        found = "not what the user asked for: " + (w.requested_reason || "not named in the request");
      }
      return "rule " + w.rule + ": " + (found || w.because || w.message || "matched");
    }).join(" · ");
  }

  function build(item) {
    var row = template.content.firstElementChild.cloneNode(true);
    row.dataset.id = item.id;
    row.dataset.deadline = item.timeout_at;
    var countdown = row.querySelector("time.countdown");
    countdown.setAttribute("datetime", item.timeout_at);
    countdown.textContent = UL.formatLeft(Date.parse(item.timeout_at) - Date.now());
    row.querySelector(".auto").hidden = !item.auto_approve_on_timeout;
    var pick = row.querySelector("input.pick-row");
    pick.value = item.id;
    pick.setAttribute("aria-label", "Select " + item.tool);
    var link = row.querySelector("a.row-link");
    link.href = "/approvals/" + item.id + "/";
    link.textContent = item.tool;
    showQuorum(row, item);
    row.querySelector(".agent").textContent = item.agent || "";
    var tags = row.querySelector(".tags");
    (item.risk_tags || []).forEach(function (tag) {
      var span = document.createElement("span");
      span.className = "tag " + UL.riskClass(tag);
      span.textContent = tag;
      tags.appendChild(span);
    });
    row.querySelector(".impact").textContent = item.estimated_impact || "";
    row.querySelector(".reasoning").textContent = reasoningOf(item);
    return row;
  }

  function insertSorted(row) {
    var deadline = Date.parse(row.dataset.deadline);
    var before = null;
    rows().some(function (other) {
      if (other !== row && Date.parse(other.dataset.deadline) > deadline) {
        before = other;
        return true;
      }
      return false;
    });
    tbody.insertBefore(row, before);
  }

  function update() {
    var count = rows().length;
    document.getElementById("queue-empty").hidden = count > 0;
    if (bar) bar.hidden = count === 0;  // nothing to pick: no bulk buttons
    if (whole) {
      UL.setPending(count);
      document.getElementById("queue-count").textContent = count;
    } else {
      document.getElementById("queue-count").textContent = parseInt(document.getElementById("nav-pending").textContent, 10) || 0;
    }
    updateBar();
  }

  function add(item, fresh) {
    if (!item || !item.id || (item.state && item.state !== "pending") || rowOf(item.id) || !matches(item)) return false;
    var row = build(item);
    insertSorted(row);
    if (fresh) {
      row.classList.add("new");
      setTimeout(function () { row.classList.remove("new"); }, 4000);
    }
    return true;
  }

  function remove(id) {
    var row = rowOf(id);
    if (!row) return;
    row.classList.add("leaving");
    row.dataset.id = "";  // a re-add of the same id (reconcile) must not find it
    setTimeout(function () { row.remove(); update(); }, 250);
  }

  function approvalId(payload) {
    return (payload.approval && payload.approval.id) || (payload.data && payload.data.approval && payload.data.approval.id);
  }

  UL.on("approval.requested", function (payload) {
    if (add(payload.approval, true)) {
      update();
      if (soundToggle.checked) UL.beep();
    } else if (!payload.approval) {
      refetch();
    }
  });
  // The "Last 7 days" card counts decisions: the server re-renders it after each one.
  var refreshStats = UL.refresher(document.getElementById("queue-stats"));
  ["approval.decided", "approval.expired"].forEach(function (kind) {
    UL.on(kind, function (payload) {
      var id = approvalId(payload);
      if (id) remove(id);
      update();
      refreshStats();
    });
  });
  UL.on("approval.counted", function (payload) {
    var row = rowOf(approvalId(payload) || "");
    if (row && payload.approval) showQuorum(row, payload.approval);
  });
  UL.on("approval.extended", function (payload) {
    var row = rowOf(approvalId(payload) || "");
    var item = payload.approval || {};
    if (!row || !item.timeout_at) return;
    row.dataset.deadline = item.timeout_at;
    row.querySelector("time.countdown").setAttribute("datetime", item.timeout_at);
    insertSorted(row);
    UL.tick();
  });

  function refetch() {
    return UL.api("GET", "/api/v1/approvals?state=pending&limit=500").then(function (data) {
      var items = (data && data.approvals) || [];
      var wanted = {};
      items.forEach(function (item) { wanted[item.id] = item; });
      rows().forEach(function (row) {
        if (!wanted[row.dataset.id]) remove(row.dataset.id);
      });
      items.forEach(function (item) {
        var row = rowOf(item.id);
        if (row && row.dataset.deadline !== item.timeout_at) {
          row.dataset.deadline = item.timeout_at;
          row.querySelector("time.countdown").setAttribute("datetime", item.timeout_at);
          insertSorted(row);
        } else if (!row && whole) {
          add(item, true);
        }
      });
      update();
      UL.tick();
    }, function (err) {
      UL.flash("Could not refresh the queue: " + err.message, "error");
    });
  }

  /* ------------------------------------------------------------ batch decisions */

  function picked() {
    return rows().filter(function (row) {
      var box = row.querySelector("input.pick-row");
      return row.dataset.id && box && box.checked;
    }).map(function (row) { return row.dataset.id; });
  }

  function updateBar() {
    if (!bar) return;
    var n = picked().length, all = rows().filter(function (row) { return row.dataset.id; }).length;
    // "Select all" says what is selected now: an emptied queue (or a new request) unticks it.
    var pickAll = document.getElementById("pick-all");
    pickAll.checked = all > 0 && n === all;
    pickAll.indeterminate = n > 0 && n < all;
    document.getElementById("picked-count").textContent = n + " selected";
    document.getElementById("batch-approve").disabled = n === 0;
    document.getElementById("batch-reject").disabled = n === 0;
  }

  /* Each request is decided on its own: the answer says which went and why the others did not. */
  function decideBatch(button, decision, reason) {
    var ids = picked();
    UL.act(button, function () {
      return UL.api("POST", "/api/v1/approvals/batch", {ids: ids, decision: decision, reason: reason || ""});
    }).then(function (data) {
      var failed = data.results.filter(function (r) { return !r.ok; });
      data.results.forEach(function (r) { if (r.ok) remove(r.id); });
      var verb = decision === "approve" ? "Approved " : "Rejected ";
      if (failed.length) {
        UL.flash(verb + data.decided + "; " + failed.length + " not: " + failed.map(function (r) {
          return r.message;
        }).join(" "), "error");
      } else {
        UL.flash(verb + data.decided + ".", "ok");
      }
      updateBar();
    }, function () {});
  }

  if (bar) {
    tbody.addEventListener("change", updateBar);
    document.getElementById("pick-all").addEventListener("change", function (event) {
      rows().forEach(function (row) { row.querySelector("input.pick-row").checked = event.target.checked; });
      updateBar();
    });
    document.getElementById("batch-approve").addEventListener("click", function (event) {
      decideBatch(event.target, "approve");
    });
    document.getElementById("batch-reject").addEventListener("click", function (event) {
      var button = event.target;
      UL.confirm({title: "Reject " + picked().length + " requests", confirm: "Reject them",
                  body: "Each agent is told the reason.", input: {label: "Reason", required: true}})
        .then(function (reason) { if (reason) decideBatch(button, "reject", reason); });
    });
  }

  /* The whole card opens its request (people tap the card, not only the tool's name): a click
     anywhere on a row that is not on its checkbox, a link or a button follows the row's link. */
  tbody.addEventListener("click", function (event) {
    if (event.defaultPrevented || event.button !== 0 || event.target.closest("a, button, input, label, td.pick")) return;
    if (window.getSelection && String(window.getSelection()).length) return;  // selecting text, not opening
    var row = event.target.closest("tr.queue-row");
    var link = row && row.dataset.id && row.querySelector("a.row-link");
    if (!link) return;
    if (event.ctrlKey || event.metaKey || event.shiftKey) window.open(link.href, "_blank");
    else location.href = link.href;
  });

  UL.onConnect(function () { refetch(); });
  update();
  updateBar();
})();
