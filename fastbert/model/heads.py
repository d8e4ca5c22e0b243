"""BERT's heads on the encoder: masked-LM, pre-training, next-sentence prediction and sequence
classification. Each holds a :class:`~fastbert.model.encoder.BertModel` (``self.bert``) and
its own parameters, loads like it (``from_pretrained``), and returns ``logits`` (and ``loss``
given labels, as Hugging Face's heads do: fastbert/model/losses.py).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from fastbert.execution.backends import Ops
from fastbert.execution.padded_positions import every_position_if, labels_at_padding
from fastbert.model import losses
from fastbert.model.config import BertConfig
from fastbert.model.encoder import BertModel, RunSetting, init_weights
from fastbert.model.layers import new_parameter
from fastbert.model.loading import PretrainedMixin
from fastbert.model.outputs import BaseModelOutputWithPooling, LogitsOutput, PreTrainingOutput


class _BertWithHead(PretrainedMixin, nn.Module):
    """A BertModel (``self.bert``) plus a head; ``forward`` returns ``logits`` (and ``loss``
    given ``labels``). Token-level labels with a target at a padded position make the call
    run dense, so that the loss reads the outputs there as Hugging Face computes them.

    ``settings``: BertModel's keyword arguments (``dtype``, ``device``, ``backend``,
    ``padding_free``, ``cuda_graphs``, ``quantize``, ``packed_weights``); the head decides
    whether the encoder has its pooler. A head defines ``logits(ops, encoded)`` (the encoder's
    output, an empty batch's too) and ``loss(logits, labels)``.
    """

    add_pooling_layer = True

    def __init__(self, config: BertConfig, **settings: Any):
        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=self.add_pooling_layer, **settings)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
    ) -> LogitsOutput:
        with every_position_if(labels_at_padding(attention_mask, labels)):
            encoded = self.bert(input_ids, attention_mask, token_type_ids)
        logits = self.logits(self.bert.ops(), encoded)
        loss = None if labels is None else self.loss(logits, labels)
        return LogitsOutput(logits, loss)

    # The run settings live on the encoder (its runner validates them when set).
    backend = RunSetting("bert")
    padding_free = RunSetting("bert")
    cuda_graphs = RunSetting("bert")
    packed_weights = RunSetting("bert")
    quantize = RunSetting("bert")
    # Activation checkpointing is the encoder's too (its layers are what it recomputes).
    gradient_checkpointing = RunSetting("bert")
    checkpointed_layers = RunSetting("bert")
    checkpoint_function = RunSetting("bert")

    def ops(self) -> Ops:
        """The hot ops this model runs with (its encoder's)."""
        return self.bert.ops()

    def init_weights(self):
        """Initialise every parameter, head included, for training from scratch (see
        :func:`init_weights`); returns the model."""
        init_weights(self, self.config)
        return self

    @property
    def dtype(self) -> torch.dtype:
        return self.bert.dtype

    @property
    def device(self) -> torch.device:
        return self.bert.device


class _WithMaskedLMHead(_BertWithHead):
    """A head model with BERT's masked-LM head: dense + activation + LayerNorm, then the
    decoder tied to the word embeddings (logits [B, S, vocab_size])."""

    def __init__(self, config: BertConfig, **kwargs):
        super().__init__(config, **kwargs)
        h = config.hidden_size
        dtype, device = self.bert.dtype, self.bert.device
        self.transform_weight = new_parameter(h, h, dtype=dtype, device=device)
        self.transform_bias = new_parameter(h, dtype=dtype, device=device)
        self.transform_ln_weight = new_parameter(h, dtype=dtype, device=device)
        self.transform_ln_bias = new_parameter(h, dtype=dtype, device=device)
        self.decoder_bias = new_parameter(config.vocab_size, dtype=dtype, device=device)

    def masked_lm_logits(self, ops: Ops, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [B, S, H] -> [B, S, vocab_size] (an empty batch: empty logits)."""
        if hidden.shape[0] == 0:
            return hidden.new_empty(0, hidden.shape[1], self.config.vocab_size)
        hidden = ops.linear(
            hidden, self.transform_weight, self.transform_bias, self.config.activation
        )
        hidden = ops.layer_norm(
            hidden, self.transform_ln_weight, self.transform_ln_bias, self.config.layer_norm_eps
        )
        return ops.linear(hidden, self.bert.embeddings.word, self.decoder_bias)


class BertForMaskedLM(_WithMaskedLMHead):
    """Masked-LM head: logits [B, S, vocab_size]; with ``labels`` ([B, S] token ids, -100 =
    not predicted), ``loss`` is their cross-entropy."""

    add_pooling_layer = False

    def logits(self, ops: Ops, encoded: BaseModelOutputWithPooling) -> torch.Tensor:
        return self.masked_lm_logits(ops, encoded.last_hidden_state)

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return losses.masked_lm_loss(logits, labels)


class BertForPreTraining(_WithMaskedLMHead):
    """BERT's pre-training heads: masked-LM logits [B, S, vocab_size] and next-sentence
    logits [B, 2] (index 0 = "B follows A") from the pooled [CLS] output. With ``labels``
    ([B, S], -100 = not predicted) and ``next_sentence_label`` ([B]), ``loss`` is the sum of
    the two cross-entropies, as in Hugging Face (None unless both are given)."""

    def __init__(self, config: BertConfig, **kwargs):
        super().__init__(config, **kwargs)
        dtype, device = self.bert.dtype, self.bert.device
        self.seq_relationship_weight = new_parameter(
            2, config.hidden_size, dtype=dtype, device=device
        )
        self.seq_relationship_bias = new_parameter(2, dtype=dtype, device=device)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        next_sentence_label: torch.Tensor | None = None,
    ) -> PreTrainingOutput:
        with every_position_if(labels_at_padding(attention_mask, labels)):
            out = self.bert(input_ids, attention_mask, token_type_ids)
        ops = self.bert.ops()
        prediction = self.masked_lm_logits(ops, out.last_hidden_state)
        relationship = self.seq_relationship(ops, out.pooler_output)
        loss = None
        if labels is not None and next_sentence_label is not None:
            loss = losses.masked_lm_loss(prediction, labels) + losses.next_sentence_loss(
                relationship, next_sentence_label
            )
        return PreTrainingOutput(prediction, relationship, loss)

    def seq_relationship(self, ops: Ops, pooled: torch.Tensor) -> torch.Tensor:
        """pooled: [B, H] -> next-sentence logits [B, 2]."""
        if pooled.shape[0] == 0:
            return pooled.new_empty(0, 2)
        return ops.linear(pooled, self.seq_relationship_weight, self.seq_relationship_bias)


class _BertForPooledClassification(_BertWithHead):
    """A linear classifier over the pooled [CLS] output: logits [B, num_outputs]."""

    def __init__(self, config: BertConfig, num_outputs: int, **kwargs):
        super().__init__(config, **kwargs)
        n = num_outputs
        dtype, device = self.bert.dtype, self.bert.device
        self.classifier_weight = new_parameter(n, config.hidden_size, dtype=dtype, device=device)
        self.classifier_bias = new_parameter(n, dtype=dtype, device=device)

    # Whether training-mode dropout falls on the pooled output (sequence classification).
    pooled_dropout = False

    def logits(self, ops: Ops, encoded: BaseModelOutputWithPooling) -> torch.Tensor:
        """The pooled [CLS] output [B, H] -> [B, num_outputs]."""
        pooled = encoded.pooler_output
        if pooled.shape[0] == 0:
            return pooled.new_empty(0, self.classifier_bias.shape[0])
        if self.pooled_dropout and self.training:
            pooled = torch.nn.functional.dropout(pooled, self._classifier_dropout_p())
        return ops.linear(pooled, self.classifier_weight, self.classifier_bias)

    def _classifier_dropout_p(self) -> float:
        config = self.config
        p = config.classifier_dropout
        return config.hidden_dropout_prob if p is None else p


class BertForNextSentencePrediction(_BertForPooledClassification):
    """Next-sentence prediction: logits [B, 2] (index 0 = "B follows A"); with ``labels``
    ([B]), ``loss`` is their cross-entropy."""

    def __init__(self, config: BertConfig, **kwargs):
        super().__init__(config, 2, **kwargs)

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return losses.next_sentence_loss(logits, labels)


class BertForSequenceClassification(_BertForPooledClassification):
    """Sequence classification: logits [B, num_labels], with dropout (``classifier_dropout``,
    else ``hidden_dropout_prob``) on the pooled output in training mode. With ``labels``,
    ``loss`` as Hugging Face computes it (fastbert.model.losses.sequence_classification_loss:
    regression, single- or multi-label by ``config.problem_type`` or the labels)."""

    pooled_dropout = True

    def __init__(self, config: BertConfig, **kwargs):
        super().__init__(config, config.num_labels, **kwargs)

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return losses.sequence_classification_loss(logits, labels, self.config.problem_type)
