"""The Keras mixed precision guide, with ``import mpcore as mp`` for ``tensorflow.keras``.

Runs as is: ``MPCORE_DATA_DIR=../shared/data/mnist python examples/mixed_precision_guide.py``
(offline, on the 8,000/2,000 split of the MNIST test set) or without MPCORE_DATA_DIR (downloads
MNIST into ~/.cache/mpcore/mnist). ``GUIDE_EPOCHS`` (default 5) shortens both trainings.
"""

import os

import numpy as np

import mpcore as mp
from mpcore import mixed_precision

EPOCHS = int(os.environ.get("GUIDE_EPOCHS", "5"))

# --- Setting the dtype policy -----------------------------------------------------------------
print(mp.check_policy("mixed_float16"))
mixed_precision.set_global_policy("mixed_float16")
policy = mixed_precision.global_policy()
print(f"Compute dtype: {policy.compute_dtype}")
print(f"Variable dtype: {policy.variable_dtype}")

# --- Building the model ------------------------------------------------------------------------
# The guide: 4096 units on a GPU (where mixed precision is fast), 64 on a CPU.
if mp.check_policy("mixed_float16").fast:
    print("The model will run with 4096 units on a fast accelerator")
    num_units = 4096
else:
    print("The model will run with 64 units on a CPU (or a device without fast float16)")
    num_units = 64

inputs = mp.Input(shape=(784,), name="digits")
dense1 = mp.layers.Dense(num_units, activation="relu", name="dense_1")
x = dense1(inputs)
dense2 = mp.layers.Dense(num_units, activation="relu", name="dense_2")
x = dense2(x)

print(dense1.dtype_policy)
print(f"x.dtype: {x.dtype}")
print(f"dense1.kernel.dtype: {dense1.kernel.dtype}")

# The output softmax stays in float32 for numeric stability.
x = mp.layers.Dense(10, name="dense_logits")(x)
outputs = mp.layers.Activation("softmax", dtype="float32", name="predictions")(x)
print(f"Outputs dtype: {outputs.dtype}")

model = mp.Model(inputs=inputs, outputs=outputs)
model.compile(loss="sparse_categorical_crossentropy", optimizer=mp.optimizers.RMSprop(),
              metrics=["accuracy"])

(x_train, y_train), (x_test, y_test) = mp.datasets.mnist.load_data()
x_train = x_train.reshape(len(x_train), 784).astype("float32") / 255
x_test = x_test.reshape(len(x_test), 784).astype("float32") / 255

# The guide's batch of 8192 assumes 60,000 training images; the offline 8,000-image split would
# get one step per epoch from it.
batch_size = 8192 if len(x_train) >= 60000 else 128

# --- Training the model with Model.fit ---------------------------------------------------------
initial_weights = model.get_weights()
history = model.fit(x_train, y_train, batch_size=batch_size, epochs=EPOCHS,
                    validation_split=0.2)
test_scores = model.evaluate(x_test, y_test, verbose=2)
print("Test loss:", test_scores[0])
print("Test accuracy:", test_scores[1])

# --- Loss scaling ------------------------------------------------------------------------------
# (x * x, not x ** 2: mpcore computes power, a *deny* op, in float32, so it would not overflow.)
x = mp.constant(256, dtype="float16")
print((x * x).numpy())  # Overflow: inf
x = mp.constant(1e-5, dtype="float16")
print((x * x).numpy())  # Underflow: 0

# --- Training the model with a custom training loop ---------------------------------------------
optimizer = mp.optimizers.RMSprop()
optimizer = mixed_precision.LossScaleOptimizer(optimizer)
loss_object = mp.losses.SparseCategoricalCrossentropy()


def batches(x, y, size, shuffle_seed=None):
    order = np.arange(len(x))
    if shuffle_seed is not None:
        np.random.default_rng(shuffle_seed).shuffle(order)
    for start in range(0, len(x), size):
        idx = order[start:start + size]
        yield x[idx], y[idx]


def train_step(x, y):
    with mp.GradientTape() as tape:
        predictions = model(x)
        loss = loss_object(y, predictions)
        scaled_loss = optimizer.get_scaled_loss(loss)
    scaled_gradients = tape.gradient(scaled_loss, model.trainable_variables)
    gradients = optimizer.get_unscaled_gradients(scaled_gradients)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    return loss


def test_step(x):
    return model(x, training=False)


model.set_weights(initial_weights)

for epoch in range(EPOCHS):
    epoch_loss_avg = mp.metrics.Mean("loss")
    test_accuracy = mp.metrics.SparseCategoricalAccuracy(name="test_accuracy")
    for x, y in batches(x_train, y_train, batch_size, shuffle_seed=epoch):
        loss = train_step(x, y)
        epoch_loss_avg.update_state(loss)
    for x, y in batches(x_test, y_test, batch_size):
        predictions = test_step(x)
        test_accuracy.update_state(y, predictions)
    print(f"Epoch {epoch}: loss={epoch_loss_avg.result()}, "
          f"test accuracy={test_accuracy.result()}")
print(f"Loss scale: {optimizer.loss_scale()}, skipped steps: {optimizer.skipped_steps}")
