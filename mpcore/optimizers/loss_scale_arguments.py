"""A LossScaleOptimizer's arguments and messages: the loss scale from TF 2.3's ``loss_scale``
or TF 2.4+'s (Keras 3's) ``dynamic``/``initial_scale``/``dynamic_growth_steps``, and tf-keras'
warnings for a step that forgot to scale or unscale."""

from __future__ import annotations

from typing import Any

from mpcore.mixed_precision import loss_scale as _ls

_EXAMPLE = """
    with mp.GradientTape() as tape:
      loss = loss_fn()
      scaled_loss = opt.get_scaled_loss(loss)
    scaled_grads = tape.gradient(scaled_loss, vars)
    grads = opt.get_unscaled_gradients(scaled_grads)
    opt.apply_gradients([(grads, var)])"""
#: tf-keras' warnings (``_maybe_warn_about_scaling``), by (scaled, unscaled), with what mpcore
#: then does.
FORGOT = {
    (False, False): "You forgot to call LossScaleOptimizer.get_scaled_loss() and "
                    "LossScaleOptimizer.get_unscaled_gradients() before calling "
                    "LossScaleOptimizer.apply_gradients(). This will likely result in worse "
                    "model quality, so please call them in the correct places! For example:"
                    f"{_EXAMPLE}\nThe gradients are applied as given (not unscaled); only the "
                    "Inf/NaN check is done. (Or call opt.minimize(loss, var_list), which "
                    "scales and unscales.)",
    (False, True): "You forgot to call LossScaleOptimizer.get_scaled_loss() before calling "
                   "LossScaleOptimizer.apply_gradients() (you did call "
                   "get_unscaled_gradients() however). This will likely result in worse model "
                   "quality, so please call get_scaled_loss() in the correct place! For "
                   f"example:{_EXAMPLE}\nThe gradients were divided by the loss scale without "
                   "the loss being multiplied by it: they are too small by that factor.",
    (True, False): "You forgot to call LossScaleOptimizer.get_unscaled_gradients() before "
                   "calling LossScaleOptimizer.apply_gradients() (you did call "
                   "get_scaled_loss() however). This will likely result in worse model "
                   "quality, so please call get_unscaled_gradients() in the correct place! For "
                   f"example:{_EXAMPLE}\nThe gradients are applied as given, still multiplied "
                   "by the loss scale; only the Inf/NaN check is done.",
}


def scale_from_arguments(loss_scale: Any, dynamic: bool | None, initial_scale: float | None,
           growth_steps: int | None) -> _ls.LossScale:
    """The loss scale from TF 2.3's ``loss_scale`` or from TF 2.4+'s (Keras 3's) arguments."""
    keras = {"dynamic": dynamic, "initial_scale": initial_scale,
             "dynamic_growth_steps": growth_steps}
    given = [name for name, value in keras.items() if value is not None]
    if isinstance(loss_scale, bool):     # TF 2.4's second positional argument
        raise TypeError("LossScaleOptimizer's second positional argument is loss_scale (TF "
                        f"2.3); pass dynamic={loss_scale} by keyword, as TF 2.4+ and Keras 3 "
                        "name it")
    if loss_scale is not None:
        if given:
            raise ValueError(f"give loss_scale (TF 2.3) or {', '.join(given)} (TF 2.4+, "
                             "Keras 3), not both")
        return _ls.get(loss_scale, allow_none=False)  # type: ignore[return-value]
    if dynamic is not None and not isinstance(dynamic, bool):
        raise TypeError(f"dynamic must be True or False, got {dynamic!r}")
    if dynamic is False:
        if initial_scale is None:
            raise ValueError("initial_scale is required when dynamic=False (a fixed loss scale)")
        if growth_steps is not None:
            raise ValueError("dynamic_growth_steps applies to a dynamic loss scale only; it "
                             "was given with dynamic=False")
    try:
        if dynamic is False:
            return _ls.FixedLossScale(initial_scale)  # type: ignore[arg-type]
        return _ls.DynamicLossScale(
            initial_loss_scale=2.0**15 if initial_scale is None else initial_scale,
            increment_period=2000 if growth_steps is None else growth_steps)
    except (TypeError, ValueError) as exc:   # named as the caller named them
        message = str(exc)
        for ours, theirs in (("initial_loss_scale", "initial_scale"),
                             ("loss_scale_value", "initial_scale"),
                             ("increment_period", "dynamic_growth_steps")):
            message = message.replace(ours, theirs)
        raise type(exc)(message) from None
