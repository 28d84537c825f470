from __future__ import annotations

from typing import Any

from rest_framework import serializers


class PoolGpuOutput(serializers.Serializer[Any]):
    uuid = serializers.CharField()
    node = serializers.CharField()
    index = serializers.IntegerField()
    model = serializers.CharField()
    status = serializers.CharField()


class PoolOutput(serializers.Serializer[Any]):
    name = serializers.CharField()
    backend = serializers.ChoiceField(choices=["agents", "slurm", "kubernetes"])
    description = serializers.CharField()
    gpus = PoolGpuOutput(many=True)
