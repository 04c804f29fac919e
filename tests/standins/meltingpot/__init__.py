"""A stand-in for Melting Pot (`dm-meltingpot`) with its interface and timestep structure, for
testing marlctl's adapter where the package is not installed: `substrate` and `scenario`
modules with the names the adapter uses, dm_env-style timesteps (`step_type`, `reward`,
`discount`, `observation`: one dict per player) and a small harvest game behind them. The real
package builds its substrates on dmlab2d; this one is a few lines of numpy."""

STANDIN = True
