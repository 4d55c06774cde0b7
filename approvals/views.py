"""Dashboard views."""

from django.contrib.auth.decorators import login_required
from django.shortcuts import render


@login_required
def queue(request):
    return render(request, "approvals/queue.html", {})
